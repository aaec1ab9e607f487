/* The math kernel's softmax of half-precision scores in one pass a row, on a CPU with AVX-512.

   Built by attn/fused.py at first use (compiled.build: -O3 -march=native, without -ffast-math:
   masked scores are -inf and must stay so), called through ctypes. The eager steps it replaces
   (attn/kernels.py, the reference it is tested against): the mask's checks and its fill, the half
   scores copied to float32, soft-maxed in place, the weights rounded back to the half dtype beside
   zeros for the keys the half product was padded with — passes over a (B, H, c, K) chunk and its
   page-sized buffers, 0.51 ns a weight on an Intel Xeon with AMX (two threads, rows of 2,210 keys)
   before the mask's; this one reads each row of scores (and of the mask) while the row is in cache
   and writes both outputs: 0.25-0.29 ns with the mask. The scores and the mask are read twice (the
   largest, then the exps: three bytes a key again, where the masked scores stored in float32 and
   loaded back had cost eight), and a row is soft-maxed only up to the last 16 keys that hold one it
   may see, the rest zeroed — a causal chunk's early rows see fewer keys than it has (AMD EPYC, two
   threads, causal chunks: 0.39 → 0.29-0.34 ns a weight at 1,024 keys, 0.42 → 0.36-0.37 at 4,096;
   the same outputs bit for bit).

   Per row: m = max_j s_j; e_j = exp(s_j − m); p_j = e_j · (1 / Σ e) — the same steps as PyTorch's
   CPU softmax, its exp a degree-6 polynomial after the reduction x = n·ln 2 + r (Cephes' expf
   coefficients; relative error ~2e-7, a few units in the last place of float32; exp of a score of
   −inf, or of any more than 104 below the row's largest, is 0). Half weights are rounded to
   nearest, ties to even, as PyTorch's conversion rounds them. A row with a NaN or +inf score where
   it may see a key, or only −inf ones, is NaN, as the eager softmax makes it.

   On the way, where asked, each row's entropy: −Σ p ln p = ln Z − Σ_j e_j (s_j − m) / Z with Z = Σ e
   (p_j = e_j / Z, ln p_j = s_j − m − ln Z) — one multiply-add a key beside its exp, where the
   analysis's row statistics took a log a weight (~60 % of their time). Both terms are >= 0 (Z >= 1,
   s_j <= m): no cancellation, so it is as close to the exact entropy as Σ p ln p of the rounded
   weights is, or closer. */

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef _OPENMP
#define IN_PARTS _Pragma("omp parallel for schedule(static) num_threads(parts) if (parts > 1)")
#else
#define IN_PARTS
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>

int64_t fused_available(void) { return 1; }

/* e^x for x <= 0 (a score less the row's largest): 0 below -104, where e^x rounds to 0 in float32,
   and for -inf; subnormal between -104 and -87.3, as the eager exp gives them. */
static inline __m512 exp_nonpositive(__m512 x) {
    __mmask16 vanishing = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-104.0f), _CMP_LT_OQ); /* and -inf */
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x); /* ln 2 in two parts: r exact */
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f))); /* e^r */
    return _mm512_maskz_mov_ps(~vanishing, _mm512_scalef_ps(p, n));                     /* e^r · 2^n */
}

static inline __mmask16 lanes(int64_t left) { return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1); }

static inline __m512 load_half(const uint16_t *s, __mmask16 k, int64_t bf16) {
    __m256i h = _mm256_maskz_loadu_epi16(k, s);
    if (bf16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

static inline void store_half(uint16_t *d, __m512 v, __mmask16 k, int64_t bf16) {
    __m256i h;
    if (bf16) { /* round to nearest even: add 0x7fff plus the kept part's lowest bit, keep the high half */
        __m512i u = _mm512_castps_si512(v);
        __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
        u = _mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
        h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16));
    } else {
        h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    _mm256_mask_storeu_epi16(d, k, h);
}

/* rows x K half scores (row r at scores + r·score_stride) -> float32 weights (row r at weights +
   r·K) and half weights (row r at half + r·half_stride, zeros at keys K..half_keys-1). Rows are
   (b, h, t) of (B, H, T); keep, when not NULL, says which keys row (b, h, t) may see (1) — its row
   at keep + b·keep_b + h·keep_h + t·keep_t, keys consecutive — and a key it may not see weighs 0;
   a row that may see none gives zeros (as the eager kernel defines it: never NaN). entropy, when not
   NULL: (rows,) each row's −Σ p ln p in nats (0 for a row that sees nothing, NaN for a NaN row). */
void half_softmax(const uint16_t *scores, int64_t score_stride, float *weights, uint16_t *half,
                  int64_t half_stride, int64_t half_keys, int64_t rows, int64_t K, int64_t bf16,
                  const uint8_t *keep, int64_t H, int64_t T, int64_t keep_b, int64_t keep_h, int64_t keep_t,
                  int64_t parts, float *entropy) {
    IN_PARTS
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *s = scores + r * score_stride;
        float *w = weights + r * K;
        uint16_t *h = half + r * half_stride;
        const uint8_t *seen = keep ? keep + (r / (H * T)) * keep_b + ((r / T) % H) * keep_h + (r % T) * keep_t : NULL;
        /* the row's largest score. `visible`: whether the row may see a key; `broken`: a key it may see
           scores NaN or +inf; `end`: the keys after the last 16 that hold one it may see weigh 0 — a causal
           chunk's rows see fewer keys than the chunk has, and they are not soft-maxed, only zeroed */
        __m512 top = _mm512_set1_ps(-INFINITY);
        __mmask16 visible = 0, broken = 0;
        int64_t end = 0;
        for (int64_t j = 0; j < K; j += 16) {
            __mmask16 k = lanes(K - j);
            __m512 x = load_half(s + j, k, bf16);
            if (seen) {
                __m128i bytes = _mm_maskz_loadu_epi8(k, seen + j);
                k = _mm_test_epi8_mask(bytes, bytes); /* any non-zero byte: True */
            }
            end = k ? j + 16 : end;
            visible |= k;
            broken |= _mm512_mask_cmp_ps_mask(k, x, _mm512_set1_ps(INFINITY), _CMP_NLT_UQ); /* NaN or +inf */
            top = _mm512_mask_max_ps(top, k, top, x);
        }
        float largest = _mm512_reduce_max_ps(top);
        if (!visible || broken || largest == -INFINITY) {
            /* no key to see: zeros (the kernel's definition); NaN or infinite scores, or -inf at every key
               it may see: NaN, as the eager softmax gives them — nothing turns finite here */
            float fill = visible ? NAN : 0.0f;
            uint16_t half_fill = visible ? (bf16 ? 0x7fc0 : 0x7e00) : 0;
            for (int64_t j = 0; j < K; j++) w[j] = fill;
            for (int64_t j = 0; j < K; j++) h[j] = half_fill;
            for (int64_t j = K; j < half_keys; j++) h[j] = 0;
            if (entropy) entropy[r] = fill;
            continue;
        }
        end = end < K ? end : K;
        /* e_j = exp(s_j − m) where the row may see key j, else 0: the scores and the mask read again (three
           bytes a key) rather than the masked scores stored and loaded in float32 (eight) */
        __m512 m = _mm512_set1_ps(largest);
        __m512 total = _mm512_setzero_ps(), spread = _mm512_setzero_ps(); /* Σ e, Σ e (s − m) */
        for (int64_t j = 0; j < end; j += 16) {
            __mmask16 k = lanes(end - j);
            __m512 d = _mm512_sub_ps(load_half(s + j, k, bf16), m);
            __mmask16 seen_here = k;
            if (seen) {
                __m128i bytes = _mm_maskz_loadu_epi8(k, seen + j);
                seen_here = _mm_test_epi8_mask(bytes, bytes);
            }
            __m512 e = _mm512_maskz_mov_ps(seen_here, exp_nonpositive(d)); /* -inf, or a hidden key: 0 */
            _mm512_mask_storeu_ps(w + j, k, e);
            total = _mm512_add_ps(total, e);
            /* only where e > 0: d is -inf at a key scored -inf (0 · -inf would be NaN), anything at a hidden one */
            spread = _mm512_mask3_fmadd_ps(e, d, spread, _mm512_cmp_ps_mask(e, _mm512_setzero_ps(), _CMP_GT_OQ));
        }
        float sum = _mm512_reduce_add_ps(total);
        if (entropy) entropy[r] = (float)(log((double)sum) - (double)_mm512_reduce_add_ps(spread) / sum);
        __m512 inverse = _mm512_set1_ps(1.0f / sum);
        for (int64_t j = 0; j < end; j += 16) {
            __mmask16 k = lanes(end - j);
            __m512 p = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, w + j), inverse);
            _mm512_mask_storeu_ps(w + j, k, p);
            store_half(h + j, p, k, bf16);
        }
        memset(w + end, 0, (size_t)(K - end) * sizeof *w);
        memset(h + end, 0, (size_t)(half_keys - end) * sizeof *h);
    }
}

#else /* no AVX-512: the eager steps stay (a CPU without it has no half units for the product either) */

int64_t fused_available(void) { return 0; }

void half_softmax(const uint16_t *scores, int64_t score_stride, float *weights, uint16_t *half,
                  int64_t half_stride, int64_t half_keys, int64_t rows, int64_t K, int64_t bf16,
                  const uint8_t *keep, int64_t H, int64_t T, int64_t keep_b, int64_t keep_h, int64_t keep_t,
                  int64_t parts, float *entropy) {
    (void)scores; (void)score_stride; (void)weights; (void)half; (void)half_stride; (void)half_keys;
    (void)rows; (void)K; (void)bf16; (void)keep; (void)H; (void)T; (void)keep_b; (void)keep_h; (void)keep_t;
    (void)parts; (void)entropy;
}

#endif
