/* The math kernel's softmax in one pass a row, on a CPU with AVX-512 or AVX2 (and FMA, F16C).

   Built by attn/fused.py at first use (compiled.build: -O3 -march=native, without -ffast-math:
   masked scores are -inf and must stay so), called through ctypes. The eager steps it replaces
   (attn/kernels.py, the reference it is tested against): the mask's checks and its fill, half
   scores copied to float32, soft-maxed in place, the weights rounded back to the half dtype beside
   zeros for the keys the half product was padded with — passes over a (B, H, c, K) chunk and its
   page-sized buffers, 0.51 ns a weight on an Intel Xeon with AMX (two threads, rows of 2,210 keys)
   before the mask's; this one reads each row of scores (and of the mask) while the row is in cache
   and writes its outputs: 0.25-0.29 ns with the mask. The scores and the mask are read twice (the
   largest, then the exps: three bytes a key again, where the masked scores stored in float32 and
   loaded back had cost eight), and a row is soft-maxed only up to the last block of keys that holds
   one it may see, the rest zeroed — a causal chunk's early rows see fewer keys than it has (AMD
   EPYC, two threads, causal chunks: 0.39 → 0.29-0.34 ns a weight at 1,024 keys, 0.42 → 0.36-0.37
   at 4,096; the same outputs bit for bit).

   The scores are float32 (a float32 model's, or a half model's on a CPU without half units: its
   product formed in float32 and rounded to the half dtype, held in float32), bfloat16 or float16;
   float32 scores may be soft-maxed in place (the weights written over them, as the eager path does).
   The half weights P·V takes are written only where asked (a half model's).

   Per row: m = max_j s_j; e_j = exp(s_j − m); p_j = e_j · (1 / Σ e) — the same steps as PyTorch's
   CPU softmax, its exp a degree-6 polynomial after the reduction x = n·ln 2 + r (Cephes' expf
   coefficients; relative error ~2e-7, a few units in the last place of float32; exp of a score of
   −inf, or of any more than 104 below the row's largest, is 0), times 2^n — at once by AVX-512's
   scalef, 8 wide by n added into p's exponent where every lane's result is a normal float (scores
   within 86 of the row's largest), else by two powers of two (2^n itself is subnormal below 2^-126;
   p·2^a is exact and the product with 2^b rounds once, as scalef rounds). Half weights are rounded to nearest, ties to
   even, as PyTorch's conversion rounds them. A row with a NaN or +inf score where it may see a key,
   or only −inf ones, is NaN, as the eager softmax makes it.

   On the way, where asked, each row's entropy: −Σ p ln p = ln Z − Σ_j e_j (s_j − m) / Z with Z = Σ e
   (p_j = e_j / Z, ln p_j = s_j − m − ln Z) — one multiply-add a key beside its exp, where the
   analysis's row statistics took a log a weight (~60 % of their time). Both terms are >= 0 (Z >= 1,
   s_j <= m): no cancellation, so it is as close to the exact entropy as Σ p ln p of the rounded
   weights is, or closer.

   Arguments (both builds): rows x K scores, row r at scores + r·score_stride elements, of `kind`
   (0 float32, 1 bfloat16, 2 float16) -> float32 weights (row r at weights + r·K; the scores
   themselves where they are float32 and score_stride == K) and, when half is not NULL, half weights
   of half_kind (1 bfloat16, 2 float16; row r at half + r·half_stride, zeros at keys K..half_keys-1).
   Rows are (b, h, t) of (B, H, T); keep, when not NULL, says which keys row (b, h, t) may see (1) —
   its row at keep + b·keep_b + h·keep_h + t·keep_t, keys consecutive — and a key it may not see
   weighs 0; a row that may see none gives zeros (as the eager kernel defines it: never NaN).
   entropy, when not NULL: (rows,) each row's −Σ p ln p in nats (0 for a row that sees nothing, NaN
   for a NaN row). */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#define IN_PARTS _Pragma("omp parallel for schedule(static) num_threads(parts) if (parts > 1)")
#else
#define IN_PARTS
#endif

/* e^x for x <= 0, both builds: 0 below EXP_FLOOR (where e^x rounds to 0 in float32) and for -inf;
   else x = n·ln 2 + r (ln 2 in two parts, so r is exact), e^r by Cephes' expf polynomial, times 2^n. */
#define EXP_FLOOR (-104.0f)
#define LOG2_E 1.44269504088896341f
#define LN2_HIGH 0.693359375f
#define LN2_LOW (-2.12194440e-4f)
#define EXP_P0 1.9875691500e-4f
#define EXP_P1 1.3981999507e-3f
#define EXP_P2 8.3334519073e-3f
#define EXP_P3 4.1665795894e-2f
#define EXP_P4 1.6666665459e-1f
#define EXP_P5 5.0000001201e-1f

/* Each build below gives the row pass (softmax_rows, after them: one implementation) the same few
   operations on W float lanes: `lanes(n)`, the first n of a block; loads of n scores (the other
   lanes unspecified: every use masks them); masked max, adds and stores. */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>

#define W 16
typedef __m512 vf;
typedef __mmask16 vmask;

int64_t fused_available(void) { return 1; }

/* e^x for x <= 0 (a score less the row's largest): 0 below -104, where e^x rounds to 0 in float32,
   and for -inf; subnormal between -104 and -87.3, as the eager exp gives them. */
static inline vf exp_nonpositive(vf x) {
    vmask vanishing = _mm512_cmp_ps_mask(x, _mm512_set1_ps(EXP_FLOOR), _CMP_LT_OQ); /* and -inf */
    x = _mm512_max_ps(x, _mm512_set1_ps(EXP_FLOOR));
    vf n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(LOG2_E)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vf r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HIGH), x); /* ln 2 in two parts: r exact */
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LOW), r);
    vf p = _mm512_set1_ps(EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P5));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f))); /* e^r */
    return _mm512_maskz_mov_ps(~vanishing, _mm512_scalef_ps(p, n));                     /* e^r · 2^n */
}

static inline vf splat(float x) { return _mm512_set1_ps(x); }
static inline vmask lanes(int64_t n) { return n >= 16 ? (vmask)0xffff : (vmask)((1u << n) - 1); }
static inline int mask_any(vmask k) { return k != 0; }
static inline vmask mask_and(vmask a, vmask b) { return a & b; }
static inline vmask mask_or(vmask a, vmask b) { return a | b; }
static inline vmask no_lanes(void) { return 0; }

/* the row's keys j.. j+n-1 it may see: any non-zero byte */
static inline vmask seen_lanes(const uint8_t *seen, int64_t n) {
    __m128i bytes = _mm_maskz_loadu_epi8(lanes(n), seen);
    return _mm_test_epi8_mask(bytes, bytes);
}

static inline vf load_scores(const char *s, int64_t j, int64_t n, int64_t kind) {
    vmask k = lanes(n);
    if (kind == 0)
        return _mm512_maskz_loadu_ps(k, (const float *)s + j);
    __m256i h = _mm256_maskz_loadu_epi16(k, (const uint16_t *)s + j);
    if (kind == 1)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

static inline vmask bad_scores(vf x) { return _mm512_cmp_ps_mask(x, _mm512_set1_ps(INFINITY), _CMP_NLT_UQ); }
static inline vf max_where(vf top, vmask k, vf x) { return _mm512_mask_max_ps(top, k, top, x); }
static inline vf max_all(vf top, vf x) { return _mm512_max_ps(top, x); }
static inline float reduce_max(vf v) { return _mm512_reduce_max_ps(v); }
static inline float reduce_add(vf v) { return _mm512_reduce_add_ps(v); }
static inline vf zero_outside(vmask k, vf x) { return _mm512_maskz_mov_ps(k, x); }
static inline vf fmadd_where_positive(vf e, vf d, vf acc) {
    return _mm512_mask3_fmadd_ps(e, d, acc, _mm512_cmp_ps_mask(e, _mm512_setzero_ps(), _CMP_GT_OQ));
}
static inline vf load_floats(const float *w, int64_t n) { return _mm512_maskz_loadu_ps(lanes(n), w); }
static inline void store_floats(float *w, vf v, int64_t n) { _mm512_mask_storeu_ps(w, lanes(n), v); }
#define STREAM_FLOATS(w, v) _mm512_stream_ps(w, v) /* 64-byte aligned w */

/* x rounded to bfloat16's precision — to nearest, ties to even: 0x7fff plus the kept part's lowest bit
   added, the low half dropped — NaN kept NaN (the carry could take a NaN with low bits set to infinity
   or zero) */
static inline vf round_bfloat16(vf x) {
    __m512i u = _mm512_castps_si512(x);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    u = _mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
    vf rounded = _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32((int)0xffff0000u)));
    return _mm512_mask_mov_ps(rounded, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

static inline void store_half(uint16_t *d, vf v, int64_t n, int64_t kind) {
    __m256i h;
    if (kind == 1) { /* its high half */
        h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(round_bfloat16(v)), 16));
    } else {
        h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    _mm256_mask_storeu_epi16(d, lanes(n), h);
}

#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#define W 8
typedef __m256 vf;
typedef __m256 vmask; /* all ones in a lane that is in */

int64_t fused_available(void) { return 1; }

/* e^r and n of x = n·ln 2 + r (ln 2 in two parts, so r is exact): the polynomial both of this
   build's exps scale by 2^n. */
static inline vf exp_reduced(vf x, vf *n) {
    *n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2_E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vf r = _mm256_fnmadd_ps(*n, _mm256_set1_ps(LN2_HIGH), x);
    r = _mm256_fnmadd_ps(*n, _mm256_set1_ps(LN2_LOW), r);
    vf p = _mm256_set1_ps(EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P5));
    return _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f))); /* e^r */
}

/* e^x for x <= 0, as the AVX-512 build's: the same polynomial; 2^n (n in [-150, 0]) as 2^a · 2^b with
   a = floor(n / 2), b = n − a, each a normal float — p · 2^a is exact, the product with 2^b rounds
   once, as scalef rounds p · 2^n: the same exps bit for bit, subnormal ones included (the weights differ
   by the rounding of their sum, 8 lanes at a time instead of 16). */
static inline vf exp_any(vf x) {
    vf vanishing = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_FLOOR), _CMP_LT_OQ); /* and -inf */
    vf n, p = exp_reduced(_mm256_max_ps(x, _mm256_set1_ps(EXP_FLOOR)), &n);
    __m256i whole = _mm256_cvtps_epi32(n);
    __m256i a = _mm256_srai_epi32(whole, 1), b = _mm256_sub_epi32(whole, a);
    __m256i bias = _mm256_set1_epi32(127);
    vf two_a = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(a, bias), 23));
    vf two_b = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(b, bias), 23));
    return _mm256_andnot_ps(vanishing, _mm256_mul_ps(_mm256_mul_ps(p, two_a), two_b)); /* e^r · 2^n */
}

/* e^x for x <= 0: where every lane's e^x is a normal float (x >= EXP_NORMAL: nearly every key of a row),
   2^n added into the exponent of e^r — p · 2^n exactly, as exp_any forms it there in two exact products,
   the same bits in 12 fewer instructions (a tenth of a float32 chunk's softmax, AMD EPYC); a vector with
   a lane below it (or NaN) goes through exp_any whole. */
#define EXP_NORMAL (-86.0f) /* n = round(x · log2 e) >= -124 and e^r >= 2^-1/2: e^x >= 2^-125 */
static inline vf exp_nonpositive(vf x) {
    if (_mm256_movemask_ps(_mm256_cmp_ps(x, _mm256_set1_ps(EXP_NORMAL), _CMP_NGE_UQ)))
        return exp_any(x);
    vf n, p = exp_reduced(x, &n);
    __m256i shift = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23); /* n · 2^23: n added to p's exponent */
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), shift));
}
static inline vf splat(float x) { return _mm256_set1_ps(x); }
static inline vmask lanes(int64_t n) {
    if (n >= 8)
        return _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}
static inline int mask_any(vmask k) { return _mm256_movemask_ps(k) != 0; }
static inline vmask mask_and(vmask a, vmask b) { return _mm256_and_ps(a, b); }
static inline vmask mask_or(vmask a, vmask b) { return _mm256_or_ps(a, b); }
static inline vmask no_lanes(void) { return _mm256_setzero_ps(); }

/* the row's keys j.. j+n-1 it may see: any non-zero byte */
static inline vmask seen_lanes(const uint8_t *seen, int64_t n) {
    uint64_t bytes = 0;
    if (n >= 8)
        memcpy(&bytes, seen, 8);
    else
        memcpy(&bytes, seen, (size_t)n);
    __m256i wide = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)bytes));
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(wide, _mm256_setzero_si256()));
}

static inline float score_at(const char *s, int64_t j, int64_t kind) {
    if (kind == 0)
        return ((const float *)s)[j];
    uint16_t h = ((const uint16_t *)s)[j];
    if (kind == 2)
        return _cvtsh_ss(h);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline vf load_scores(const char *s, int64_t j, int64_t n, int64_t kind) {
    if (n < 8) { /* a row's last keys: through a block of the stack (the other lanes 0) */
        float part[8] = {0};
        for (int64_t i = 0; i < n; i++) part[i] = score_at(s, j + i, kind);
        return _mm256_loadu_ps(part);
    }
    if (kind == 0)
        return _mm256_loadu_ps((const float *)s + j);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)s + j));
    if (kind == 1)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

static inline vmask bad_scores(vf x) { return _mm256_cmp_ps(x, _mm256_set1_ps(INFINITY), _CMP_NLT_UQ); }
static inline vf max_where(vf top, vmask k, vf x) { return _mm256_max_ps(top, _mm256_blendv_ps(top, x, k)); }
static inline vf max_all(vf top, vf x) { return _mm256_max_ps(top, x); }
static inline float reduce_max(vf v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}
static inline float reduce_add(vf v) {
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_add_ss(m, _mm_shuffle_ps(m, m, 1)));
}
static inline vf zero_outside(vmask k, vf x) { return _mm256_and_ps(k, x); }
static inline vf fmadd_where_positive(vf e, vf d, vf acc) {
    return _mm256_blendv_ps(acc, _mm256_fmadd_ps(e, d, acc), _mm256_cmp_ps(e, _mm256_setzero_ps(), _CMP_GT_OQ));
}
static inline vf load_floats(const float *w, int64_t n) {
    return n >= 8 ? _mm256_loadu_ps(w) : _mm256_maskload_ps(w, _mm256_castps_si256(lanes(n)));
}
static inline void store_floats(float *w, vf v, int64_t n) {
    if (n >= 8)
        _mm256_storeu_ps(w, v);
    else
        _mm256_maskstore_ps(w, _mm256_castps_si256(lanes(n)), v);
}

static inline void store_half(uint16_t *d, vf v, int64_t n, int64_t kind) {
    __m128i h;
    if (kind == 1) { /* round to nearest even: add 0x7fff plus the kept part's lowest bit, keep the high half */
        __m256i u = _mm256_castps_si256(v);
        __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
        u = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
        h = _mm_packus_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1)); /* 0..65535: exact */
    } else {
        h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    if (n >= 8) {
        _mm_storeu_si128((__m128i *)d, h);
    } else {
        uint16_t part[8];
        _mm_storeu_si128((__m128i *)part, h);
        memcpy(d, part, (size_t)n * sizeof *d);
    }
}

#endif

#ifdef W
/* The keys a row may see, from its mask's bytes once: every key before *open (a causal row's past: no
   mask read there), none from *last on (a causal chunk's rows see fewer keys than it has). */
static void row_extent(const uint8_t *seen, int64_t K, int64_t *open, int64_t *last) {
    *open = K, *last = K;
    if (!seen)
        return;
    const uint8_t *hidden = memchr(seen, 0, (size_t)K);
    *open = hidden ? hidden - seen : K;
    uint64_t word;
    while (*last - 8 >= *open && (memcpy(&word, seen + *last - 8, 8), word == 0)) *last -= 8;
    while (*last > *open && !seen[*last - 1]) (*last)--;
}

/* Each text's rows' extents (row_extent: open, last; (texts · T, 2)), read once where every head's mask row
   is the same one (keep_h = 0, the causal and padding masks): read again for each head it had been H
   scans of a row's bytes for one answer — SmolLM2 bfloat16's 9 heads at 8k tokens, 0.5 s of memchr in
   a 19 s analysis (Xeon with AMX). NULL where the mask differs by head, or the memory is not there
   (each row then reads its own). */
static int64_t *shared_extents(const uint8_t *keep, int64_t rows, int64_t H, int64_t T, int64_t K, int64_t keep_b,
                               int64_t keep_h, int64_t keep_t, int64_t parts) {
    if (!keep || keep_h != 0 || H < 1 || T < 1 || rows < 1)
        return NULL;
    const int64_t texts = rows / (H * T); /* rows: (B, H, T) */
    int64_t *found = malloc((size_t)(texts * T) * 2 * sizeof *found);
    if (!found)
        return NULL;
    IN_PARTS
    for (int64_t r = 0; r < texts * T; r++)
        row_extent(keep + (r / T) * keep_b + (r % T) * keep_t, K, found + 2 * r, found + 2 * r + 1);
    return found;
}

/* row r of (B, H, T)'s extents, from shared_extents' where they are, else read from its mask row */
static inline void extents_of(const int64_t *shared, const uint8_t *seen, int64_t r, int64_t H, int64_t T, int64_t K,
                              int64_t *open, int64_t *last) {
    if (shared) {
        const int64_t at = 2 * ((r / (H * T)) * T + r % T);
        *open = shared[at];
        *last = shared[at + 1];
    } else {
        row_extent(seen, K, open, last);
    }
}

/* One row: its scores s (K of `kind`) -> float32 weights w (K), half weights h (half_keys, zeros at
   keys K..half_keys-1) where h is not NULL, and its entropy where `entropy` is not NULL. e: K floats
   of the thread's own, 64-byte aligned, for the row's exponentials — the weights then written once,
   past the cache (streaming stores: a store to a line not in cache first reads it from memory, and a
   chunk's map, tens of MB, is not in cache: SmolLM2 bfloat16's 36 GB of weights at 8k tokens were
   read as often as written; three 292-row chunks of its 9 heads over 1k, 4k and 8k keys, Xeon with
   AMX, 28.6–33.2 → 26.7–27.4 ms alternating) — or NULL: they go through w. */
static void softmax_row(const char *s, int64_t kind, float *w, uint16_t *h, int64_t half_keys, int64_t half_kind,
                        int64_t K, const uint8_t *seen, int64_t open, int64_t last, float *entropy, float *e,
                        int64_t from, float top, int bad_before) {
    /* the row's largest score. `visible`: whether the row may see a key; `broken`: a key it may see
       scores NaN or +inf; `end`: the keys after the last block that holds one it may see weigh 0 — they
       are not soft-maxed, only zeroed */
    int visible = last > 0;
    int64_t end = (last + W - 1) / W * W;
    end = end < K ? end : K;
    vf largest_so_far = splat(top); /* the keys before `from` (a multiple of W, <= open): read as they were
                                        scored, their largest `top`, a NaN or +inf among them `bad_before` */
    vmask bad = no_lanes();
    int64_t j = from;
    for (; j + W <= open; j += W) { /* every lane seen */
        vf x = load_scores(s, j, W, kind);
        bad = mask_or(bad, bad_scores(x)); /* NaN or +inf */
        largest_so_far = max_all(largest_so_far, x);
    }
    for (; j < end; j += W) {
        int64_t n = end - j < W ? end - j : W;
        vf x = load_scores(s, j, n, kind);
        vmask k = seen ? seen_lanes(seen + j, n) : lanes(n);
        bad = mask_or(bad, mask_and(k, bad_scores(x)));
        largest_so_far = max_where(largest_so_far, k, x);
    }
    int broken = bad_before || mask_any(bad);
    float largest = reduce_max(largest_so_far);
    if (!visible || broken || largest == -INFINITY) {
        /* no key to see: zeros (the kernel's definition); NaN or infinite scores, or -inf at every key
           it may see: NaN, as the eager softmax gives them — nothing turns finite here */
        float fill = visible ? NAN : 0.0f;
        uint16_t half_fill = visible ? (half_kind == 1 ? 0x7fc0 : 0x7e00) : 0;
        for (int64_t j = 0; j < K; j++) w[j] = fill;
        if (h) {
            for (int64_t j = 0; j < K; j++) h[j] = half_fill;
            for (int64_t j = K; j < half_keys; j++) h[j] = 0;
        }
        if (entropy) *entropy = fill;
        return;
    }
    /* e_j = exp(s_j − m) where the row may see key j, else 0: the scores and the mask read again (three
       bytes a key for half scores) rather than the masked scores stored and loaded in float32 (eight) */
    float *x = e ? e : w; /* the exponentials */
    vf m = splat(largest), total = splat(0.0f), spread = splat(0.0f); /* m, Σ e, Σ e (s − m) */
    for (j = 0; j + W <= open; j += W) { /* every lane seen: the same steps, no mask */
        vf d = load_scores(s, j, W, kind) - m; /* (GCC's vector arithmetic, either width) */
        vf ej = exp_nonpositive(d);
        store_floats(x + j, ej, W);
        total = total + ej;
        spread = fmadd_where_positive(ej, d, spread);
    }
    for (; j < end; j += W) {
        int64_t n = end - j < W ? end - j : W;
        vf d = load_scores(s, j, n, kind) - m;
        vmask k = seen ? seen_lanes(seen + j, n) : lanes(n);
        vf ej = zero_outside(k, exp_nonpositive(d)); /* -inf, or a hidden key: 0 */
        store_floats(x + j, ej, n);
        total = total + ej;
        /* only where e > 0: d is -inf at a key scored -inf (0 · -inf would be NaN), anything at a hidden one */
        spread = fmadd_where_positive(ej, d, spread);
    }
    float sum = reduce_add(total);
    if (entropy) *entropy = (float)(log((double)sum) - (double)reduce_add(spread) / sum);
    vf inverse = splat(1.0f / sum);
    j = 0;
#ifdef STREAM_FLOATS
    if (e) { /* up to w's first 64-byte line as below, then whole lines past the cache */
        int64_t head = (int64_t)((64 - ((uintptr_t)w & 63)) & 63) / (int64_t)sizeof *w;
        head = head < end ? head : end;
        if (head > 0) { /* fewer than W */
            vf p = load_floats(x, head) * inverse;
            store_floats(w, p, head);
            if (h) store_half(h, p, head, half_kind);
        }
        for (j = head; j + W <= end; j += W) {
            vf p = load_floats(x + j, W) * inverse;
            STREAM_FLOATS(w + j, p);
            if (h) store_half(h + j, p, W, half_kind);
        }
    }
#endif
    for (; j < end; j += W) {
        int64_t n = end - j < W ? end - j : W;
        vf p = load_floats(x + j, n) * inverse;
        store_floats(w + j, p, n);
        if (h) store_half(h + j, p, n, half_kind);
    }
    memset(w + end, 0, (size_t)(K - end) * sizeof *w);
    if (h) memset(h + end, 0, (size_t)(half_keys - end) * sizeof *h);
}

/* row r of (B, H, T)'s mask row, or NULL */
static inline const uint8_t *mask_row(const uint8_t *keep, int64_t r, int64_t H, int64_t T, int64_t keep_b,
                                      int64_t keep_h, int64_t keep_t) {
    return keep ? keep + (r / (H * T)) * keep_b + ((r / T) % H) * keep_h + (r % T) * keep_t : NULL;
}

void softmax_rows(const void *scores, int64_t score_stride, int64_t kind, float *weights, uint16_t *half,
                  int64_t half_stride, int64_t half_keys, int64_t half_kind, int64_t rows, int64_t K,
                  const uint8_t *keep, int64_t H, int64_t T, int64_t keep_b, int64_t keep_h, int64_t keep_t,
                  int64_t parts, float *entropy) {
    const int64_t size = kind ? 2 : 4;
    int64_t *shared = shared_extents(keep, rows, H, T, K, keep_b, keep_h, keep_t, parts);
    IN_PARTS
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *seen = mask_row(keep, r, H, T, keep_b, keep_h, keep_t);
        int64_t open, last;
        extents_of(shared, seen, r, H, T, K, &open, &last);
        /* the row's scores; its float32 weights in their place where the scores are float32 */
        softmax_row((const char *)scores + r * score_stride * size, kind, weights + r * K,
                    half ? half + r * half_stride : NULL, half_keys, half_kind, K, seen, open, last,
                    entropy ? entropy + r : NULL, NULL, 0, -INFINITY, 0);
    }
    free(shared);
}

/* ------------------------------------------------------------------------------------------------
   The whole attention of a half (bfloat16) model on the AMX tiles, a tile of 16 query rows at a time:
   QKᵀ on the tiles, the rows soft-maxed by softmax_row while their scores are in cache, P·V on the
   tiles — the scores and the half weights never leave the thread's buffers (~1 MiB at 8k keys), where
   the products through oneDNN wrote and read each of them through memory (8 of the ~24 bytes a weight
   moved) and kept a primitive for every chunk's shape (~230 MiB at 8k tokens of a 28-layer model).
   The float32 weights are written to the map as softmax_rows writes them.

   The products round as oneDNN's bfloat16 GEMM does: float32 sums, the scores rounded to bfloat16
   (and, for a scale that is not a power of two, multiplied by it in float32 and rounded again, as the
   eager `product * scale` does; a power of two scales q before, exactly), the output rounded once.
   Their float32 sums run in another order than oneDNN's, so a score on a rounding boundary may round
   the other way (one unit of bfloat16).

   tdpbf16ps C += A·B: A (16 × 32) bfloat16 rows, B its VNNI form — row i holds the pairs (2i, 2i+1)
   of the 16 columns — C (16 × 16) float32. For QKᵀ, B is 32 dimensions × 16 keys: a key's dimensions
   2i and 2i+1 are next to each other in k, so a row of B is a gather of 32-bit words (pack_keys); for
   P·V, B is 32 keys × 16 dimensions: the pairs of two keys' values interleaved (pack_values). */
#if W == 16 && defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#ifdef _OPENMP
#include <omp.h>
#endif
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define TILE_ROWS 16 /* query rows of a tile; keys of a score block */
#define VALUE_KEYS 32 /* keys of a P·V block */

/* Whether the tiles may be used: the kernel grants this process the tiles' state (Linux asks). */
int64_t tiles_available(void) { return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0; }

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t bytes[16];
    uint8_t rows[16];
} tile_config;

/* eight tiles of 16 rows × 64 bytes: 0 the scores' sums, 1 q, 2 keys or values, 3-6 the output's sums
   (64 of its dimensions), 7 the half weights */
static void configure_tiles(void) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) c.bytes[t] = 64, c.rows[t] = TILE_ROWS;
    _tile_loadconfig(&c);
}

static inline int64_t up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

/* keys (S, Dk) -> for each block of 16 keys and of 32 dimensions, B of QKᵀ: row i = the 16 keys'
   dimensions (2i, 2i+1), a 32-bit word each; zeros for the keys S..keys16-1 */
static void pack_keys(const uint32_t *k, int64_t S, int64_t Dk, uint32_t *out) {
    int64_t pairs = Dk / 2, blocks = Dk / 32;
    for (int64_t kb = 0; kb < up(S, 16) / 16; kb++)
        for (int64_t db = 0; db < blocks; db++) {
            uint32_t *o = out + (kb * blocks + db) * 256;
            for (int64_t n = 0; n < 16; n++) {
                int64_t key = kb * 16 + n;
                for (int64_t i = 0; i < 16; i++) o[i * 16 + n] = key < S ? k[key * pairs + db * 16 + i] : 0;
            }
        }
}

/* values (S, Dv) -> for each block of 32 keys and of 16 dimensions, B of P·V: row i = the pairs of
   keys 2i and 2i+1 at the 16 dimensions; zeros for the keys S..keys32-1 */
static void pack_values(const uint16_t *v, int64_t S, int64_t Dv, uint16_t *out) {
    int64_t blocks = Dv / 16;
    for (int64_t kb = 0; kb < up(S, VALUE_KEYS) / VALUE_KEYS; kb++)
        for (int64_t db = 0; db < blocks; db++) {
            uint16_t *o = out + (kb * blocks + db) * 512;
            for (int64_t i = 0; i < 16; i++)
                for (int64_t pair = 0; pair < 2; pair++) {
                    int64_t key = kb * VALUE_KEYS + 2 * i + pair;
                    for (int64_t n = 0; n < 16; n++) o[(i * 16 + n) * 2 + pair] = key < S ? v[key * Dv + db * 16 + n] : 0;
                }
        }
}

/* half words of a thread's buffers: a tile's scores and half weights (16 rows of up(S,32) each), q
   for a tile of fewer than 16 rows, and a row's float32 exponentials (up(S,16)) */
int64_t tile_scratch(int64_t S, int64_t Dk) { return 2 * TILE_ROWS * up(S, VALUE_KEYS) + TILE_ROWS * Dk + 2 * up(S, 16); }

/* tiles 3-6, four 16 × 16 blocks of float32 sums side by side: zeroed; stored as 16 rows of 64 */
static inline void sums_zeroed(void) {
    _tile_zero(3);
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
}
static inline void sums_stored(float *sums) {
    _tile_stored(3, sums, 256);
    _tile_stored(4, sums + 16, 256);
    _tile_stored(5, sums + 32, 256);
    _tile_stored(6, sums + 48, 256);
}

/* 16 float32 sums -> 16 bfloat16 scores, rounded as oneDNN rounds its product (then scaled and rounded
   again, as eager's `product * scale`, where scale is not 1) */
static inline vf store_score(uint16_t *score, const float *sum, float scale) {
    vf x = _mm512_load_ps(sum);
    if (scale != 1.0f) x = round_bfloat16(x) * splat(scale);
    __m512i bits = _mm512_castps_si512(round_bfloat16(x));
    _mm256_storeu_si256((__m256i *)score, _mm512_cvtepi32_epi16(_mm512_srli_epi32(bits, 16)));
    /* the score as load_scores reads it back: its high half */
    return _mm512_castsi512_ps(_mm512_and_si512(bits, _mm512_set1_epi32((int)0xffff0000u)));
}

/* q (groups, rows, Dk), k (groups, S, Dk), v (groups, S, Dv): bfloat16, contiguous; group g's rows are
   rows g·rows .. of the (B, H, T) map (the G query heads of a key/value head stacked: rows = G·T).
   -> weights (groups·rows, S) float32 (zeros past a row's last visible block), out (groups, rows, Dv)
   bfloat16, entropy (groups·rows) where not NULL; keep as softmax_rows reads it. kpack
   (groups, up(S,16)·Dk/2) and vpack (groups, up(S,32)·Dv): the packed keys and values; scratch:
   parts · tile_scratch(S, Dk) half words, a thread's tile buffers each. Dk a multiple of 32, Dv of
   64, S >= 1. packed: 0 — k and v are packed here, first; else kpack and vpack already hold the first
   `packed` >= S keys of every group as pack_operands packs them (a streamed layer's operands, packed once
   for all its chunks: each chunk had copied and packed its keys again — SmolLM2 bfloat16's analysis of
   8k tokens 20.9 → 18.3 s, Xeon with AMX, two threads), k and v not read — a chunk's block of 32 keys past S then holds the layer's next keys where it held zeros:
   their weights are 0 all the same. */
void pack_operands(const uint16_t *k, const uint16_t *v, int64_t groups, int64_t S, int64_t Dk, int64_t Dv,
                   uint32_t *kpack, uint16_t *vpack, int64_t parts) {
    IN_PARTS
    for (int64_t g = 0; g < groups; g++) {
        pack_keys((const uint32_t *)(k + g * S * Dk), S, Dk, kpack + g * up(S, 16) * Dk / 2);
        pack_values(v + g * S * Dv, S, Dv, vpack + g * up(S, VALUE_KEYS) * Dv);
    }
}


void attend_rows(const uint16_t *q, const uint16_t *k, const uint16_t *v, int64_t groups, int64_t rows, int64_t S,
                 int64_t Dk, int64_t Dv, float scale, float *weights, uint16_t *out, const uint8_t *keep, int64_t H,
                 int64_t T, int64_t keep_b, int64_t keep_h, int64_t keep_t, float *entropy, uint32_t *kpack,
                 uint16_t *vpack, uint16_t *scratch, int64_t parts, int64_t packed) {
    const int64_t keys32 = up(S, VALUE_KEYS), dim_blocks = Dk / 32, value_blocks = Dv / 16;
    const int64_t tiles = (rows + TILE_ROWS - 1) / TILE_ROWS;
    /* a group's keys in the packs: S where they are packed here, else the `packed` they hold */
    const int64_t packed16 = up(packed ? packed : S, 16), packed32 = up(packed ? packed : S, VALUE_KEYS);
    if (!packed) pack_operands(k, v, groups, S, Dk, Dv, kpack, vpack, parts);
    int64_t *shared = shared_extents(keep, groups * rows, H, T, S, keep_b, keep_h, keep_t, parts);
#ifdef _OPENMP
#pragma omp parallel num_threads(parts) if (parts > 1)
#endif
    {
        configure_tiles();
#ifdef _OPENMP
        uint16_t *scores = scratch + omp_get_thread_num() * tile_scratch(S, Dk);
#else
        uint16_t *scores = scratch;
#endif
        uint16_t *probs = scores + TILE_ROWS * keys32, *short_q = probs + TILE_ROWS * keys32;
        float *exps = (float *)(short_q + TILE_ROWS * Dk); /* a row's exponentials (64-byte aligned) */
        float sums[TILE_ROWS * 64] __attribute__((aligned(64)));
        {
            memset(probs, 0, (size_t)(TILE_ROWS * keys32) * sizeof *probs);
            memset(short_q, 0, (size_t)(TILE_ROWS * Dk) * sizeof *short_q);
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
            for (int64_t n = 0; n < groups * tiles; n++) {
                const int64_t g = n / tiles, first = g * rows + (n % tiles) * TILE_ROWS; /* (B, H, T) row */
                const int64_t m = rows - (n % tiles) * TILE_ROWS < TILE_ROWS ? rows - (n % tiles) * TILE_ROWS : TILE_ROWS;
                const uint8_t *seen[TILE_ROWS];
                int64_t open[TILE_ROWS], last[TILE_ROWS], reach = 0;
                for (int64_t r = 0; r < m; r++) {
                    seen[r] = mask_row(keep, first + r, H, T, keep_b, keep_h, keep_t);
                    extents_of(shared, seen[r], first + r, H, T, S, &open[r], &last[r]);
                    reach = last[r] > reach ? last[r] : reach;
                }
                const uint16_t *qt = q + first * Dk;
                if (m < TILE_ROWS) {
                    memcpy(short_q, qt, (size_t)(m * Dk) * sizeof *short_q);
                    qt = short_q;
                }
                /* QKᵀ over the blocks of 16 keys up to the last one a row of the tile may see, a block at a
                   time, q's tiles loaded again for each (on this Xeon 0.18 ns a score on one thread, in a
                   micro-benchmark of 16 rows × 8,192 keys × 64 dimensions; four blocks into four tiles of
                   sums, or q's tiles kept loaded: 0.27-0.28 ns) */
                const uint32_t *kp = kpack + g * packed16 * Dk / 2;
                const int64_t blocks = up(reach, 16) / 16, step = dim_blocks * 256; /* a block of keys' words */
                /* each row's largest score, and whether one is NaN or +inf, over the blocks of keys it sees
                   whole, as they are scored (softmax_row's own pass over them had been an eighth of this
                   function's time: the scores read again from L2) */
                vf tops[TILE_ROWS];
                __mmask16 bads[TILE_ROWS];
                for (int64_t r = 0; r < TILE_ROWS; r++) tops[r] = splat(-INFINITY), bads[r] = 0;
                for (int64_t kb = 0; kb < blocks; kb++) {
                    _tile_zero(0);
                    for (int64_t db = 0; db < dim_blocks; db++) {
                        _tile_loadd(1, qt + db * 32, Dk * 2);
                        _tile_loadd(2, kp + kb * step + db * 256, 64);
                        _tile_dpbf16ps(0, 1, 2);
                    }
                    _tile_stored(0, sums, 64);
                    for (int64_t r = 0; r < TILE_ROWS; r++) {
                        vf x = store_score(scores + r * keys32 + kb * 16, sums + r * 16, scale);
                        if (r < m && (kb + 1) * 16 <= open[r]) {
                            bads[r] |= bad_scores(x);
                            tops[r] = max_all(tops[r], x);
                        }
                    }
                }
                const int64_t reach32 = up(reach, VALUE_KEYS);
                for (int64_t r = 0; r < m; r++)
                    softmax_row((const char *)(scores + r * keys32), 1, weights + (first + r) * S, probs + r * keys32,
                                reach32, 1, S, seen[r], open[r], last[r], entropy ? entropy + first + r : NULL,
                                exps, open[r] / 16 * 16, reduce_max(tops[r]), bads[r] != 0);
                /* P·V, 64 dimensions at a time */
                for (int64_t d0 = 0; d0 < value_blocks; d0 += 4) {
                    const uint16_t *vp = vpack + g * packed32 * Dv + d0 * 512;
                    sums_zeroed();
                    for (int64_t kb = 0; kb < reach32 / VALUE_KEYS; kb++) {
                        const uint16_t *b = vp + kb * value_blocks * 512;
                        _tile_loadd(7, probs + kb * VALUE_KEYS, keys32 * 2);
                        _tile_loadd(0, b, 64);
                        _tile_dpbf16ps(3, 7, 0);
                        _tile_loadd(1, b + 512, 64);
                        _tile_dpbf16ps(4, 7, 1);
                        _tile_loadd(2, b + 1024, 64);
                        _tile_dpbf16ps(5, 7, 2);
                        _tile_loadd(0, b + 1536, 64);
                        _tile_dpbf16ps(6, 7, 0);
                    }
                    sums_stored(sums);
                    for (int64_t r = 0; r < m; r++)
                        for (int64_t c = 0; c < 4; c++)
                            store_half(out + (first + r) * Dv + d0 * 16 + c * 16, _mm512_load_ps(sums + r * 64 + c * 16),
                                       16, 1);
                }
            }
        }
        _tile_release();
        _mm_sfence(); /* the streamed weights visible to whoever reads the map next */
    }
    free(shared);
}

/* ------------------------------------------------------------------------------------------------
   A Gram matrix of bfloat16 rows on the tiles: u (N, X), row stride X -> out (N, N) float32, out[a][b]
   = Σ_x u[a][x]·u[b][x] (each product exact in float32, summed in float32), symmetric exactly (the
   upper triangle's tiles mirrored). The redundancy cosine's Gram of its heads' unit contributions
   (N = 270 heads of SmolLM2, X = 576 dimensions × 96 rows): oneDNN's GEMM of that short, wide
   product ran at ~0.5 TFLOP/s on this Xeon's two cores (13-15 ms a step). Here the columns are taken
   GRAM_COLUMNS at a time, every row's share of them packed once as the tiles read them (A's rows and
   B's VNNI pairs, ~2.3 MiB for 270 rows), and every pair of tiles on or above the diagonal adds that
   share's products into its sums, kept in memory between the shares — a 2 × 2 block of output tiles
   at a time: two rows' tiles of A, two of B, four sums in the eight tiles (9-10 ms a step; shares of
   256, 512, 1,024 and 4,096 columns: 12.5, 13.5, 9.1, 11.1 ms). Each tile product reads a kilobyte a
   sum from L2: its bandwidth, not the tiles, sets the pace. */
#define GRAM_COLUMNS 2048 /* columns of u a share: 64 blocks of 32 */

/* rows t·16 .. t·16+15 of u, columns c0 .. c0+31 (zeros past N and X) -> a (16 × 32) bfloat16 block
   A, and B its VNNI form: row i = the 16 rows' columns (2i, 2i+1), a 32-bit word each */
static void gram_pack(const uint16_t *u, int64_t N, int64_t X, int64_t t, int64_t c0, uint16_t *a, uint32_t *b) {
    for (int64_t r = 0; r < 16; r++) {
        const int64_t row = t * 16 + r, n = X - c0 < 32 ? X - c0 : 32;
        if (row < N && n == 32) {
            memcpy(a + r * 32, u + row * X + c0, 64);
        } else {
            memset(a + r * 32, 0, 64);
            if (row < N && n > 0) memcpy(a + r * 32, u + row * X + c0, (size_t)n * 2);
        }
    }
    /* B = A's 16 × 16 words transposed: pairs of rows interleaved by words, then by pairs of words
       (within each 128-bit lane: lane L of b[4i + j] holds column 4L + j of rows 4i .. 4i+3), then the
       lanes gathered across (the gathers of a column a row had cost as much as the products) */
    __m512i r[16], w[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_load_si512(a + i * 32);
    for (int i = 0; i < 16; i += 2) {
        w[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        w[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(w[i], w[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(w[i], w[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(w[i + 1], w[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(w[i + 1], w[i + 3]);
    }
    for (int j = 0; j < 4; j++) {
        __m512i low = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x44), high = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xEE);
        __m512i low2 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x44), high2 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xEE);
        _mm512_store_si512(b + j * 16, _mm512_shuffle_i32x4(low, low2, 0x88));
        _mm512_store_si512(b + (4 + j) * 16, _mm512_shuffle_i32x4(low, low2, 0xDD));
        _mm512_store_si512(b + (8 + j) * 16, _mm512_shuffle_i32x4(high, high2, 0x88));
        _mm512_store_si512(b + (12 + j) * 16, _mm512_shuffle_i32x4(high, high2, 0xDD));
    }
}

void gram_rows(const uint16_t *u, int64_t N, int64_t X, float *out, int64_t parts) {
    const int64_t tiles = (N + 15) / 16, tiles2 = (tiles + 1) / 2 * 2, blocks = tiles2 / 2;
    const int64_t pairs = blocks * (blocks + 1) / 2; /* 2 × 2 blocks of tiles on or above the diagonal */
    const int64_t shares = (X + GRAM_COLUMNS - 1) / GRAM_COLUMNS;
    uint16_t *a_pack = aligned_alloc(64, (size_t)(tiles2 * (GRAM_COLUMNS / 32)) * 1024);
    uint32_t *b_pack = aligned_alloc(64, (size_t)(tiles2 * (GRAM_COLUMNS / 32)) * 1024);
    float *sums = aligned_alloc(64, (size_t)(tiles2 * tiles2) * 1024);
    if (!a_pack || !b_pack || !sums) { /* no memory: NaN, never a wrong finite Gram */
        for (int64_t n = 0; n < N * N; n++) out[n] = NAN;
        free(a_pack), free(b_pack), free(sums);
        return;
    }
    memset(sums, 0, (size_t)(tiles2 * tiles2) * 1024);
#ifdef _OPENMP
#pragma omp parallel num_threads(parts) if (parts > 1)
#endif
    {
        configure_tiles();
        for (int64_t share = 0; share < shares; share++) {
            const int64_t c0 = share * GRAM_COLUMNS, width = X - c0 < GRAM_COLUMNS ? X - c0 : GRAM_COLUMNS;
            const int64_t subs = (width + 31) / 32; /* blocks of 32 columns in this share */
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
            for (int64_t n = 0; n < tiles2 * subs; n++) {
                const int64_t t = n / subs, sub = n % subs;
                gram_pack(u, N, X, t, c0 + sub * 32, a_pack + (t * subs + sub) * 512, b_pack + (t * subs + sub) * 256);
            }
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
            for (int64_t n = 0; n < pairs; n++) { /* block (p, q), p <= q: tiles 2p, 2p+1 of A by 2q, 2q+1 of B */
                int64_t p = 0, first = 0;
                while (first + blocks - p <= n) first += blocks - p, p++;
                const int64_t q = p + (n - first), ta = 2 * p, tb = 2 * q;
                float *s00 = sums + (ta * tiles2 + tb) * 256, *s01 = s00 + 256;
                float *s10 = sums + ((ta + 1) * tiles2 + tb) * 256, *s11 = s10 + 256;
                _tile_loadd(0, s00, 64);
                _tile_loadd(1, s01, 64);
                _tile_loadd(2, s10, 64);
                _tile_loadd(3, s11, 64);
                for (int64_t sub = 0; sub < subs; sub++) {
                    _tile_loadd(4, a_pack + (ta * subs + sub) * 512, 64);
                    _tile_loadd(5, a_pack + ((ta + 1) * subs + sub) * 512, 64);
                    _tile_loadd(6, b_pack + (tb * subs + sub) * 256, 64);
                    _tile_loadd(7, b_pack + ((tb + 1) * subs + sub) * 256, 64);
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_dpbf16ps(1, 4, 7);
                    _tile_dpbf16ps(2, 5, 6);
                    _tile_dpbf16ps(3, 5, 7);
                }
                _tile_stored(0, s00, 64);
                _tile_stored(1, s01, 64);
                _tile_stored(2, s10, 64);
                _tile_stored(3, s11, 64);
            }
        }
        _tile_release();
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t a = 0; a < N; a++) /* the tiles on or above the diagonal, mirrored below it */
            for (int64_t b = 0; b < N; b++) {
                const int64_t lo = a < b ? a : b, hi = a < b ? b : a;
                out[a * N + b] = sums[((lo / 16) * tiles2 + hi / 16) * 256 + (lo % 16) * 16 + hi % 16];
            }
    }
    free(a_pack), free(b_pack), free(sums);
}

#define TILES_BUILT 1
#endif


#else /* neither AVX-512 nor AVX2 with FMA and F16C: the eager steps stay */

int64_t fused_available(void) { return 0; }

void softmax_rows(const void *scores, int64_t score_stride, int64_t kind, float *weights, uint16_t *half,
                  int64_t half_stride, int64_t half_keys, int64_t half_kind, int64_t rows, int64_t K,
                  const uint8_t *keep, int64_t H, int64_t T, int64_t keep_b, int64_t keep_h, int64_t keep_t,
                  int64_t parts, float *entropy) {
    (void)scores; (void)score_stride; (void)kind; (void)weights; (void)half; (void)half_stride; (void)half_keys;
    (void)half_kind; (void)rows; (void)K; (void)keep; (void)H; (void)T; (void)keep_b; (void)keep_h; (void)keep_t;
    (void)parts; (void)entropy;
}

#endif

#ifndef TILES_BUILT /* no AMX tiles in this build: the products' path (fused.tiles_available is False) */
int64_t tiles_available(void) { return 0; }

void gram_rows(const uint16_t *u, int64_t N, int64_t X, float *out, int64_t parts) {
    (void)u; (void)N; (void)X; (void)out; (void)parts;
}

void pack_operands(const uint16_t *k, const uint16_t *v, int64_t groups, int64_t S, int64_t Dk, int64_t Dv,
                   uint32_t *kpack, uint16_t *vpack, int64_t parts) {
    (void)k; (void)v; (void)groups; (void)S; (void)Dk; (void)Dv; (void)kpack; (void)vpack; (void)parts;
}

void attend_rows(const uint16_t *q, const uint16_t *k, const uint16_t *v, int64_t groups, int64_t rows, int64_t S,
                 int64_t Dk, int64_t Dv, float scale, float *weights, uint16_t *out, const uint8_t *keep, int64_t H,
                 int64_t T, int64_t keep_b, int64_t keep_h, int64_t keep_t, float *entropy, uint32_t *kpack,
                 uint16_t *vpack, uint16_t *scratch, int64_t parts, int64_t packed) {
    (void)packed;
    (void)q; (void)k; (void)v; (void)groups; (void)rows; (void)S; (void)Dk; (void)Dv; (void)scale; (void)weights;
    (void)out; (void)keep; (void)H; (void)T; (void)keep_b; (void)keep_h; (void)keep_t; (void)entropy; (void)kpack;
    (void)vpack; (void)scratch; (void)parts;
}
#endif
