/* The row readers of the analysis in one pass over each row of an attention chunk.

   Built by native.py at first use (gcc -O3 -march=native -ffast-math, -fopenmp where it builds),
   called through ctypes with the GIL released: one call whose ranges of rows run on the OpenMP
   threads, or built without OpenMP one call per range, each on a thread of native.py's pool. The
   eager PyTorch code of heads.py, longcontext.py, maps.py, syntax.py, typical.py (the induction
   pattern) and redundancy.py (the JS distance) is the reference these are tested against; this
   file holds no other idea. Weights are float32 (B, H, C, K), contiguous: rows start..start+C of a
   self-attention whose real tokens are 0..n-1 (right padding), over its first K keys.

   Per row i (absolute position), keys j, d = |i - j|: one vectorised pass for the head metrics
   (mass, sum p d, largest weight, and p log p unless the softmax formed the row's entropy: a single
   set of vector reductions a row — a set per range of keys cost more than the keys themselves),
   the key-set masses read at the sets' keys, then, for the long-context metrics, the row's mass per
   distance bin (a plain sum per bin). */

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Each entry point splits its rows (or heads) in `parts` ranges (consecutive; pairwise_js's
   interleaved) and, when built with
   OpenMP, runs them on the OpenMP threads of PyTorch's own runtime (the same libgomp, found by its
   soname in the process): right after PyTorch's last parallel region its workers spin, waiting
   for the next, and a thread pool of our own competed with them for the cores — rows of 4,096 keys
   read by two threads of a Python pool 0.70 ns a weight after a PyTorch operation, by two OpenMP
   threads 0.31. Without OpenMP the pragma is ignored and the caller passes one range a call. */
#ifdef _OPENMP
#define IN_PARTS _Pragma("omp parallel for schedule(static, 1) num_threads(parts) if (parts > 1)")
#else
#define IN_PARTS
#endif

/* 1 when built with OpenMP (the caller then makes one call with `parts` ranges). */
int64_t openmp_parts(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

static inline int64_t part_bound(int64_t lo, int64_t hi, int64_t part, int64_t parts) {
    return lo + (hi - lo) * part / parts;
}

#define BINS 18
#define HEAD_VALUES 12 /* heads.ROW_METRICS order */
#define LONG_VALUES 8  /* longcontext._ROW_METRICS order */

/* The head metrics' pass, where it takes a log a weight (the compiled softmax did not form the rows'
   entropies: maps made whole or by the eager steps, or no compiled softmax), is vectorised 16 floats wide
   with the inline log below where GCC compiles for AVX-512: 1.85x glibc's vector logf there (one
   thread, rows of 4,096 keys: 1.27 → 0.69 ns a weight). Elsewhere (8 wide, AVX2, or clang) glibc's
   logf stays: the inline log 8 wide was slower than it (1.17 → 1.55 ns on AVX2). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__AVX512F__)
#pragma GCC push_options
#pragma GCC target("prefer-vector-width=512")
#define WIDE_ROWS 1
#define ROW_LOG log_positive
#else
#define ROW_LOG logf
#endif

#ifdef WIDE_ROWS
/* ln x of a positive normal float, inline so that the row loop vectorises it: x = m·2^e with m in
   [√½, √2), ln x = e·ln 2 + ln(1 + t), t = m − 1, by Cephes' logf polynomial (relative error
   ~1.2e-7 over [1e-37, 2], the same as glibc's logf under -ffast-math). */
static inline float log_positive(float x) {
    int32_t bits;
    memcpy(&bits, &x, sizeof bits);
    float e = (float)((bits >> 23) - 127);
    bits = (bits & 0x007fffff) | 0x3f800000; /* m in [1, 2) */
    float m;
    memcpy(&m, &bits, sizeof m);
    int high = m > 1.41421356f;
    m = high ? m * 0.5f : m;
    e = high ? e + 1.0f : e;
    float t = m - 1.0f, z = t * t;
    float y = 7.0376836292E-2f;
    y = y * t - 1.1514610310E-1f;
    y = y * t + 1.1676998740E-1f;
    y = y * t - 1.2420140846E-1f;
    y = y * t + 1.4249322787E-1f;
    y = y * t - 1.6668057665E-1f;
    y = y * t + 2.0000714765E-1f;
    y = y * t - 2.4999993993E-1f;
    y = y * t + 3.3333331174E-1f;
    y = y * t * z - 0.5f * z;
    return t + y + e * 0.69314718056f;
}
#endif

/* A row's sums over its keys, formed in one pass (row_pass): sum p d (every term of one sign: no
   cancellation), largest weight and, with `with_log`, sum p log p — a log a weight, the pass's costliest
   term by far, left out where the softmax formed the row's entropy from its scores — and, where asked,
   its mass on the keys whose previous token is the row's own (the induction pattern) and each key's
   weight added into a column. */
typedef struct {
    float dist, plogp, max, repeat;
} row_sums_t;

/* Keys [a, b) of the row (position i) into the sums; returns the segment's mass (its distance bin's).
   The flags are constants where it is inlined, so that each body vectorises with its accumulators side by
   side — one read of a weight for every sum (the row had been read three or four times: its mass, distances
   and largest; the induction keys; the columns; the distance bins). Keys counted in int32 so that AVX2
   converts them to float too. */
static inline __attribute__((always_inline)) float segment(const float *restrict p, int32_t a, int32_t b, int32_t i,
                                                           const int with_log, const int with_repeat,
                                                           const int with_column, const int32_t *restrict prev,
                                                           int32_t token, float *restrict column,
                                                           row_sums_t *restrict acc) {
    float mass = 0.f, dist = 0.f, plogp = 0.f, max = 0.f, repeat = 0.f;
    for (int32_t j = a; j < b; j++) {
        float v = p[j];
        mass += v;
        dist += v * fabsf((float)(j - i));
        if (with_log) plogp += v * ROW_LOG(fmaxf(v, FLT_MIN)); /* 0 log 0 = 0: a finite log that 0 multiplies away */
        max = fmaxf(max, v);
        if (with_repeat) repeat += prev[j] == token ? v : 0.f;
        if (with_column) column[j] += v;
    }
    acc->dist += dist;
    acc->plogp += plogp;
    acc->max = fmaxf(acc->max, max);
    acc->repeat += repeat;
    return mass;
}

/* The keys [a, b) of a row in one segment(), the induction pattern's sum over those before i + 1 only. */
static inline __attribute__((always_inline)) float keys_of(const float *restrict p, int64_t a, int64_t b, int64_t i,
                                                           const int with_log, const int with_repeat,
                                                           const int with_column, const int32_t *restrict prev,
                                                           int32_t token, float *restrict column,
                                                           row_sums_t *restrict acc) {
    if (a >= b) return 0.f;
    if (with_repeat && a < i + 1 && b > i + 1) /* split where the induction keys end */
        return segment(p, (int32_t)a, (int32_t)(i + 1), (int32_t)i, with_log, 1, with_column, prev, token, column, acc) +
               segment(p, (int32_t)(i + 1), (int32_t)b, (int32_t)i, with_log, 0, with_column, prev, token, column, acc);
    if (with_repeat && a < i + 1)
        return segment(p, (int32_t)a, (int32_t)b, (int32_t)i, with_log, 1, with_column, prev, token, column, acc);
    return segment(p, (int32_t)a, (int32_t)b, (int32_t)i, with_log, 0, with_column, prev, token, column, acc);
}

/* A row's keys 0..E-1 (its position i) read once into acc and, where bins is not null, its mass per
   distance bin (d = 0, then [2^(k-1), 2^k) for k = 1..BINS-1, the last bin taking every farther key):
   the keys in key order, in segments that are the bins' ranges — left of the row the far bins first,
   then the keys within 15 of it (binned one by one after), then the bins right of it — each bin's
   mass the sum of its own keys (not a difference of running sums: a small mass would lose its digits). */
static inline __attribute__((always_inline)) void row_pass(const float *restrict p, int64_t E, int64_t i,
                                                           const int with_log, const int with_repeat,
                                                           const int with_column, const int32_t *restrict prev,
                                                           int32_t token, float *restrict column, double *restrict bins,
                                                           row_sums_t *restrict acc) {
#define KEYS(a, b) keys_of(p, a, b, i, with_log, with_repeat, with_column, prev, token, column, acc)
    if (!bins) {
        KEYS(0, E);
        return;
    }
    for (int k = BINS - 1; k >= 5; k--) { /* left of the row, farthest first: keys i - far .. i - near */
        int64_t near = (int64_t)1 << (k - 1), far = k == BINS - 1 ? INT64_MAX / 4 : ((int64_t)1 << k) - 1;
        int64_t a = i - far < 0 ? 0 : i - far, b = i - near + 1 < E ? i - near + 1 : E;
        if (a < b) bins[k] += KEYS(a, b);
    }
    int64_t lo = i - 15 < 0 ? 0 : i - 15, hi = i + 16 < E ? i + 16 : E; /* within 15: one by one below */
    KEYS(lo, hi);
    for (int64_t j = lo; j < hi; j++) {
        int64_t d = j < i ? i - j : j - i;
        int k = 0;
        while (d) { /* k: d in [2^(k-1), 2^k) */
            k++;
            d >>= 1;
        }
        bins[k] += p[j];
    }
    for (int k = 5; k < BINS; k++) { /* right of it: keys i + near .. i + far */
        int64_t near = (int64_t)1 << (k - 1), far = k == BINS - 1 ? INT64_MAX / 4 : ((int64_t)1 << k) - 1;
        int64_t a = i + near, b = i + far + 1 < E ? i + far + 1 : E;
        if (a < b) bins[k] += KEYS(a, b);
    }
#undef KEYS
}

/* A row's mass on a set of its keys: keys[0..n) ascending (those from K on weigh 0 here: not read).
   The key sets (the first token, separators, punctuation) are a few keys a text: read one by one,
   not tested at every key (three tests and adds a weight cost more than the row's mass and max). */
static inline double set_mass(const float *restrict p, const int32_t *restrict keys, int64_t n, int64_t K) {
    float s = 0.f;
    for (int64_t m = 0; m < n && keys[m] < K; m++) s += p[keys[m]];
    return s;
}

static inline double key(const float *p, int64_t K, int64_t j) { return j >= 0 && j < K ? p[j] : 0.0; }

/* Rows [row0, row1) of the B*H*C rows, added into heads (B, H, HEAD_VALUES) and, when long_sums is
   not null, long_sums (B, H, LONG_VALUES) and hist (B, H, BINS), all float64 sums over the rows
   whose query counts (valid (B, C), 1: a real token), and, when columns float32 is not null, each
   key's weight summed over those rows: columns (n, K) for the n (text, head) pairs bh0, bh0 + 1, …
   the rows belong to. Key sets: text b's first real token, its separators and its punctuation are
   set_keys[set_bounds[3b + s] .. set_bounds[3b + s + 1]) for s = 0, 1, 2, ascending. log_n (B, H,
   C): log of the keys each row may see (rows with log_n > 0 count for entropy_norm and
   kl_uniform). entropy (B, H, C), when not null: each row's entropy as the softmax formed it (no
   log a weight here), else −Σ p log p of the weights. When repeat is not null, repeat (B, H):
   each row's mass on its keys j <= i whose previous token, key_token (B, K), is the row's own,
   token (B, C) (< 0: none) — the induction pattern on the text itself. */
static void rows_statistics(const float *w, int64_t H, int64_t C, int64_t K, int64_t start,
                            const int32_t *set_keys, const int64_t *set_bounds, const uint8_t *valid,
                            const float *log_n, const float *row_entropy, int64_t row0, int64_t row1, double *heads,
                            double *long_sums, double *hist, double *repeat, float *columns, int64_t bh0,
                            const int32_t *key_token, const int32_t *token, const int32_t *extent) {
    for (int64_t row = row0; row < row1; row++) {
        int64_t c = row % C, bh = row / C, b = bh / H;
        if (!valid[b * C + c]) continue;
        const float *p = w + row * K;
        int64_t i = start + c;
        /* the keys read: those before the row's extent (the later ones weigh exactly 0: every sum
           below is the same without them — a causal chunk's rows, a third of its map at 1k keys) */
        int64_t E = extent && extent[row] > 0 && extent[row] < K ? extent[row] : K;
        /* one read of the row for its sums, the induction pattern (the keys after earlier occurrences of the
           row's token), the weight each key receives (summed over the rows: vertical concentration) and the
           distance bins — in one of the eight bodies its flags pick */
        row_sums_t acc = {0.f, 0.f, 0.f, 0.f};
        double bins[BINS] = {0};
        const int with_log = !row_entropy, with_repeat = repeat && token[b * C + c] >= 0, with_column = columns != 0;
        const int32_t *prev_tokens = with_repeat ? key_token + b * K : 0;
        const int32_t own = with_repeat ? token[b * C + c] : 0;
        float *column = with_column ? columns + (bh - bh0) * K : 0;
        double *binned = long_sums ? bins : 0;
#define PASS(l, r, m) row_pass(p, E, i, l, r, m, prev_tokens, own, column, binned, &acc)
        switch (with_log * 4 + with_repeat * 2 + with_column) {
        case 0: PASS(0, 0, 0); break;
        case 1: PASS(0, 0, 1); break;
        case 2: PASS(0, 1, 0); break;
        case 3: PASS(0, 1, 1); break;
        case 4: PASS(1, 0, 0); break;
        case 5: PASS(1, 0, 1); break;
        case 6: PASS(1, 1, 0); break;
        default: PASS(1, 1, 1); break;
        }
#undef PASS
        if (with_repeat) repeat[bh] += acc.repeat;
        double sets[3];
        for (int n = 0; n < 3; n++)
            sets[n] = set_mass(p, set_keys + set_bounds[3 * b + n], set_bounds[3 * b + n + 1] - set_bounds[3 * b + n], E);
        double entropy = row_entropy ? (double)row_entropy[row] : -(double)acc.plogp, logn = log_n[row];
        double self = key(p, E, i), prev = key(p, E, i - 1), next = key(p, E, i + 1);
        double *out = heads + bh * HEAD_VALUES;
        out[0] += entropy;
        out[2] += acc.dist;
        out[3] += self;
        out[4] += prev;
        out[5] += next;
        out[6] += key(p, E, i - 2) + prev + self + next + key(p, E, i + 2);
        out[7] += sets[0];
        out[8] += sets[1];
        out[9] += sets[2];
        out[10] += acc.max;
        if (logn > 0) {
            out[1] += entropy / (logn > 1e-12 ? logn : 1e-12);
            out[11] += logn - entropy;
        }
        if (!long_sums) continue;
        /* d <= w (w = 64, 256, 1024, powers of 2): the bins below w's (d < w), and the two keys at w */
        double window[3];
        for (int n = 0; n < 3; n++) {
            int64_t width = (int64_t)64 << (2 * n);
            double inside = bins[0];
            for (int k = 1; ((int64_t)1 << (k - 1)) < width; k++) inside += bins[k];
            window[n] = inside + key(p, E, i - width) + key(p, E, i + width);
        }
        double first4 = 0, sink_far = 0; /* the first 4 keys; those of them farther than 1,024 */
        for (int64_t j = 0; j < 4 && j < K; j++) {
            first4 += p[j];
            if (j <= i - 1025) sink_far += p[j];
        }
        /* d > w: the bins from w's on (d >= w), less the two keys at exactly w — summed, not the
           difference of the row's mass and a window (a small mass would lose its digits) */
        double beyond[2];
        for (int n = 0; n < 2; n++) {
            int64_t width = (int64_t)256 << (2 * n);
            double outside = 0;
            for (int k = BINS - 1; ((int64_t)1 << (k - 1)) >= width; k--) outside += bins[k];
            beyond[n] = outside - key(p, E, i - width) - key(p, E, i + width);
        }
        double *ls = long_sums + bh * LONG_VALUES;
        ls[0] += p[0];
        ls[1] += first4;
        ls[2] += beyond[0];
        ls[3] += beyond[1];
        ls[4] += window[0];
        ls[5] += window[1];
        ls[6] += window[2];
        ls[7] += beyond[1] - sink_far;
        double *h = hist + bh * BINS;
        for (int k = 0; k < BINS; k++) h[k] += bins[k];
    }
}

/* Each of `rows` rows of K bools (visible: 0 or 1 bytes, rows after one another): its last 1 + 1,
   or K where it has none — eight bytes a test from the end (a causal row's keys it may not see are
   its last ones). */
void row_extents(const uint8_t *visible, int64_t rows, int64_t K, int32_t *out) {
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *v = visible + r * K;
        int64_t n = K;
        uint64_t eight;
        while (n >= 8 && (memcpy(&eight, v + n - 8, sizeof eight), eight == 0)) n -= 8;
        while (n > 0 && !v[n - 1]) n--;
        out[r] = (int32_t)(n > 0 ? n : K);
    }
}

/* How many keys each row may see among its text's real ones: rows (B, Hv, C) of K bools (visible:
   0 or 1 bytes, (Bv, Hv, C, K) after one another, Bv = B or 1: one mask for every text) and each
   text's real keys (valid (B, vstride) 0 or 1 bytes, its first K read) -> out (B, Hv, C) int32.
   What (visible & valid).sum(-1) counts, without its (B, Hv, C, K) temporary and its bytes summed
   as int64 (0.14 s of SmolLM2's 4k analysis, AMD EPYC): eight bytes a step, summed as the bytes
   they are (each 0 or 1). */
void visible_counts(const uint8_t *visible, int64_t Bv, int64_t B, int64_t Hv, int64_t C, int64_t K,
                    const uint8_t *valid, int64_t vstride, int32_t *out) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t r = 0; r < Hv * C; r++) {
            const uint8_t *v = visible + ((Bv == 1 ? 0 : b) * Hv * C + r) * K, *m = valid + b * vstride;
            int64_t n = 0, j = 0;
            for (; j + 8 <= K; j += 8) {
                uint64_t x, y;
                memcpy(&x, v + j, sizeof x);
                memcpy(&y, m + j, sizeof y);
                n += __builtin_popcountll(x & y); /* bytes of 0 or 1: one bit each */
            }
            for (; j < K; j++) n += v[j] & m[j];
            out[b * Hv * C + r] = (int32_t)n;
        }
}

/* What the row statistics of a chunk read and where they add (row_statistics, read_chunk): its map, the
   rows' key sets, counts, entropies and extents, and the sums — heads (parts, B, H, HEAD_VALUES),
   long_sums (parts, B, H, LONG_VALUES) and hist (parts, B, H, BINS), repeat (parts, B, H) when not null:
   each part's own — and columns: part after part, the (text, head) pairs of its own rows only, (pairs, K)
   each (a few rows a chunk at long context: a (B, H, K) block a part would outweigh the map). */
typedef struct {
    const float *w; /* (B, H, C, K) */
    int64_t B, H, C, K, start;
    const int32_t *set_keys;
    const int64_t *set_bounds;
    const uint8_t *valid;
    const float *log_n, *row_entropy;
    double *heads, *long_sums, *hist, *repeat; /* (parts, B, H, ·): each part's own sums, as row_statistics */
    float *columns;                            /* (B·H, K): each (text, head)'s own row, or null */
    const int32_t *prev, *token, *extent;
} stats_pass;

/* rows [row0, row1) of the chunk into part n's sums (its columns from row column_at[n]; first_pair: the
   (text, head) pair of its first row) */
static void stats_rows(const stats_pass *x, const int64_t *column_at, int64_t row0, int64_t row1, int64_t n,
                       int64_t first_pair) {
    const int64_t bh = x->B * x->H;
    rows_statistics(x->w, x->H, x->C, x->K, x->start, x->set_keys, x->set_bounds, x->valid, x->log_n, x->row_entropy,
                    row0, row1, x->heads + n * bh * HEAD_VALUES, x->long_sums ? x->long_sums + n * bh * LONG_VALUES : 0,
                    x->long_sums ? x->hist + n * bh * BINS : 0, x->repeat ? x->repeat + n * bh : 0,
                    x->columns ? x->columns + column_at[n] * x->K : 0, first_pair, x->prev, x->token, x->extent);
}

/* rows_statistics over rows [row0, row1) in `parts` ranges, the n-th into part `part` + n's sums — each
   row's mass on the keys j <= its position whose token before them is its own (prev (B, K) int32, each
   key's; token (B, C) int32, each row's, < 0: none) among them. extent (B, H, C) int32, or null: each
   row's keys from extent on weigh exactly 0 (it may not see them), not read. */
void row_statistics(const stats_pass *x, const int64_t *column_at, int64_t row0, int64_t row1, int64_t parts,
                    int64_t part) {
    IN_PARTS
    for (int64_t n = 0; n < parts; n++) {
        const int64_t a = part_bound(row0, row1, n, parts), b = part_bound(row0, row1, n + 1, parts);
        stats_rows(x, column_at, a, b, part + n, a / x->C);
    }
}

/* Σ_j m_j ln m_j over keys 0..K-1 of the mixture m = (p + q) / 2 (0 ln 0 = 0): float lanes over
   blocks of 256 keys, the blocks added in double. Of q = p it is Σ p ln p exactly as this sums it
   (m = p in float); not inlined, so that a head's own sums and its pairs' are one body, summed in
   one order: a copied head's JS is 0 to the bit. */
#ifdef __AVX512F__
#include <immintrin.h>
/* ln x of 16 positive normal floats, by a table: x = 2^e · m, m in [1, 2) (getexp, getmant), its
   mantissa's top 4 bits choosing c ≈ the middle of m's sixteenth, ln m = ln(m / c) + ln c with
   d = m / c − 1 (one FMA of m and c's reciprocal, |d| < 1/32) and ln(1 + d) to d^5 (truncated at
   d^6 / 6 < 2e-10). 13 instructions a vector where the Cephes form of log_positive takes ~25: the JS's
   pass, a log for every pair of heads at every key, ran 1.7x as fast (AMD EPYC Zen 4). What the sums
   take, m · ln m, is within 6e-8 of float64's over [FLT_MIN, 1] (ln's own error: 4e-6 near FLT_MIN,
   the float rounding of −87; 1e-3 relative just below 1, where ln m ~ 6e-5), as log_positive's.
   The tables are rc = float(1 / c) and ln c = float(−ln rc) of that rounded reciprocal (in double),
   so that m · rc − 1 and −ln rc are of one number. */
static const float JS_RECIP[16] = {
    0.969696999f, 0.914285719f, 0.864864886f, 0.820512831f, 0.780487776f, 0.744186044f, 0.711111128f, 0.680851042f,
    0.653061211f, 0.627451003f, 0.603773594f, 0.581818163f, 0.561403513f, 0.542372882f, 0.524590135f, 0.507936537f};
static const float JS_LN_C[16] = { /* −ln JS_RECIP[i] in double, rounded */
    0.030771628f, 0.0896121562f, 0.145181984f, 0.19782573f, 0.247836202f, 0.295464218f, 0.340926558f, 0.384411722f,
    0.426084429f, 0.466089696f, 0.504556f, 0.541597307f, 0.577315331f, 0.611801565f, 0.645138025f, 0.677398741f};
static inline __m512 ln16(__m512 x, __m512 recip, __m512 ln_c) {
    __m512 m = _mm512_getmant_ps(x, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_src);     /* [1, 2) */
    __m512 e = _mm512_getexp_ps(x);                                              /* floor(log2 x) */
    __m512i i = _mm512_srli_epi32(_mm512_castps_si512(x), 19);                   /* low 4 bits: m's top 4 */
    __m512 d = _mm512_fmsub_ps(m, _mm512_permutexvar_ps(i, recip), _mm512_set1_ps(1.f));
    __m512 t = _mm512_fmadd_ps(_mm512_set1_ps(0.2f), d, _mm512_set1_ps(-0.25f));
    t = _mm512_fmadd_ps(t, d, _mm512_set1_ps(1.f / 3.f));
    t = _mm512_fmadd_ps(t, d, _mm512_set1_ps(-0.5f));
    __m512 ln1p = _mm512_fmadd_ps(t, _mm512_mul_ps(d, d), d);                    /* ln(1 + d) */
    return _mm512_fmadd_ps(e, _mm512_set1_ps(0.69314718056f), _mm512_add_ps(ln1p, _mm512_permutexvar_ps(i, ln_c)));
}
__attribute__((noinline))
static double mixture_plogp(const float *restrict p, const float *restrict q, int64_t K) {
    const __m512 recip = _mm512_loadu_ps(JS_RECIP), ln_c = _mm512_loadu_ps(JS_LN_C);
    const __m512 half = _mm512_set1_ps(0.5f), tiny = _mm512_set1_ps(FLT_MIN);
    double total = 0.0;
    for (int64_t j0 = 0; j0 < K; j0 += 256) {
        int64_t j1 = j0 + 256 < K ? j0 + 256 : K;
        __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
        int64_t j = j0;
        for (; j + 32 <= j1; j += 32) { /* two accumulators: the sums' additions not one chain */
            __m512 m0 = _mm512_mul_ps(half, _mm512_add_ps(_mm512_loadu_ps(p + j), _mm512_loadu_ps(q + j)));
            __m512 m1 = _mm512_mul_ps(half, _mm512_add_ps(_mm512_loadu_ps(p + j + 16), _mm512_loadu_ps(q + j + 16)));
            s0 = _mm512_fmadd_ps(m0, ln16(_mm512_max_ps(m0, tiny), recip, ln_c), s0);
            s1 = _mm512_fmadd_ps(m1, ln16(_mm512_max_ps(m1, tiny), recip, ln_c), s1);
        }
        for (; j < j1; j += 16) { /* the rest, 16 at a time, past the end masked to 0 (0 ln 0 = 0) */
            __mmask16 k = j1 - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (j1 - j)) - 1u);
            __m512 m0 = _mm512_mul_ps(half, _mm512_add_ps(_mm512_maskz_loadu_ps(k, p + j), _mm512_maskz_loadu_ps(k, q + j)));
            s0 = _mm512_fmadd_ps(m0, ln16(_mm512_max_ps(m0, tiny), recip, ln_c), s0);
        }
        total += (double)_mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
    }
    return total;
}
#else
__attribute__((noinline))
static double mixture_plogp(const float *restrict p, const float *restrict q, int64_t K) {
    double total = 0.0;
    for (int64_t j0 = 0; j0 < K; j0 += 256) {
        int64_t j1 = j0 + 256 < K ? j0 + 256 : K;
        float s = 0.f;
        for (int64_t j = j0; j < j1; j++) {
            float m = 0.5f * (p[j] + q[j]);
            s += m * ROW_LOG(fmaxf(m, FLT_MIN));
        }
        total += s;
    }
    return total;
}
#endif

/* The Jensen–Shannon distances of every two of N heads on R rows: maps (N, R, S) float32, each
   row r read up to its length (written into lengths (R,)): its last key any head weighs, plus one
   (at least 1) — the keys after add exactly 0. own (N, R) scratch: Σ p ln p of each head's row.
   out (N, N): Σ_r sqrt(JS(a, b)_r) in bits, JS = (own_a + own_b) / 2 − Σ m ln m clamped at 0, for
   b > a (0 on the diagonal), each part the rows a = n, n + parts, … of the triangle (interleaved:
   the parts' shares of pairs about equal); the caller mirrors it, and answers R = 0 itself. */
void pairwise_js(const float *maps, int64_t N, int64_t R, int64_t S, int64_t parts, int64_t block, int64_t *lengths,
                 double *own, double *out) {
    IN_PARTS
    for (int64_t n = 0; n < parts; n++)
        for (int64_t r = n; r < R; r += parts) {
            int64_t length = 1;
            for (int64_t a = 0; a < N; a++) {
                const float *p = maps + (a * R + r) * S;
                for (int64_t j = S - 1; j >= length; j--)
                    if (p[j] != 0.f) {
                        length = j + 1;
                        break;
                    }
            }
            lengths[r] = length;
        }
    IN_PARTS
    for (int64_t n = 0; n < parts; n++)
        for (int64_t a = n; a < N; a += parts)
            for (int64_t r = 0; r < R; r++) {
                const float *p = maps + (a * R + r) * S;
                own[a * R + r] = mixture_plogp(p, p, lengths[r]);
            }
    /* the rows in blocks whose every head's keys fit `block` floats (the last cache's share): a pair's
       rows were read from memory once for every head before it — past a few MiB of rows the pass ran
       at memory's speed, 3 G pair-elements a second, where the rows in cache run at 5.9 (AMD EPYC Zen 4,
       270 heads × 32 rows of 1,024 keys). Each pair's sum goes on in the same order of rows. */
    for (int64_t r0 = 0; r0 < R;) {
        int64_t r1 = r0 + 1, keys = lengths[r0];
        while (r1 < R && (keys + lengths[r1]) * N <= block) keys += lengths[r1++];
        IN_PARTS
        for (int64_t n = 0; n < parts; n++)
            for (int64_t a = n; a < N; a += parts) {
                out[a * N + a] = 0.0; /* a head and itself: the same rows */
                for (int64_t b = a + 1; b < N; b++) {
                    double sum = r0 == 0 ? 0.0 : out[a * N + b];
                    for (int64_t r = r0; r < r1; r++) {
                        double js = 0.5 * (own[a * R + r] + own[b * R + r])
                                    - mixture_plogp(maps + (a * R + r) * S, maps + (b * R + r) * S, lengths[r]);
                        sum += js > 0.0 ? sqrt(js / 0.69314718055994531) : 0.0;
                    }
                    out[a * N + b] = sum;
                }
            }
        r0 = r1;
    }
}

#ifdef WIDE_ROWS
#pragma GCC pop_options
#endif

/* Columns of x (H, D, n) — half (bfloat16 bits, where bf16) or float32 — made unit vectors in place:
   x[h, :, r] / max(|x[h, :, r]|, 1e-12), the norm summed in float32 over d and the quotient — formed
   as the product with the norm's reciprocal (a division a weight was the pass's slowest step; the two
   differ by an ulp of float32 at most) — rounded to the nearest bfloat16 (ties to even; a NaN stays
   NaN), as x.div_(norm) rounds it. Tiles of 256
   columns, each read twice while it is in cache: the eager steps (a float32 copy of the layer's
   block, its square, their sum, the division) made two float32 blocks the size of the layer's and
   freshly paged memory for each — SmolLM2's 30 layers at 1k rows took 0.19-1.1 s in them, 0.03 s
   here (AMD EPYC). Parallel over (head, tile) in `parts` ranges. */
#define UNIT_TILE 256 /* native.py's UNIT_TILE */
static inline float from_bf16(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN: quiet, not rounded away */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
void unit_columns(void *x, int64_t H, int64_t D, int64_t n, int64_t bf16, int64_t parts) {
    int64_t tiles = (n + UNIT_TILE - 1) / UNIT_TILE;
    IN_PARTS
    for (int64_t part = 0; part < parts; part++)
        for (int64_t item = part_bound(0, H * tiles, part, parts); item < part_bound(0, H * tiles, part + 1, parts);
             item++) {
            int64_t h = item / tiles, a = item % tiles * UNIT_TILE, b = a + UNIT_TILE < n ? a + UNIT_TILE : n, w = b - a;
            float total[UNIT_TILE];
            for (int64_t r = 0; r < w; r++) total[r] = 0.f;
            if (bf16) {
                const uint16_t *col = (const uint16_t *)x + h * D * n + a;
                for (int64_t d = 0; d < D; d++)
                    for (int64_t r = 0; r < w; r++) {
                        float v = from_bf16(col[d * n + r]);
                        total[r] += v * v;
                    }
            } else {
                const float *col = (const float *)x + h * D * n + a;
                for (int64_t d = 0; d < D; d++)
                    for (int64_t r = 0; r < w; r++) total[r] += col[d * n + r] * col[d * n + r];
            }
            for (int64_t r = 0; r < w; r++) { /* clamped below at 1e-12, a NaN kept (tested on the bits: -ffast-math) */
                float norm = sqrtf(total[r]);
                uint32_t bits;
                memcpy(&bits, &norm, sizeof bits);
                total[r] = 1.f / ((bits & 0x7fffffffu) > 0x7f800000u ? norm : fmaxf(norm, 1e-12f)); /* its reciprocal */
            }
            if (bf16) {
                uint16_t *col = (uint16_t *)x + h * D * n + a;
                for (int64_t d = 0; d < D; d++)
                    for (int64_t r = 0; r < w; r++) col[d * n + r] = to_bf16(from_bf16(col[d * n + r]) * total[r]);
            } else {
                float *col = (float *)x + h * D * n + a;
                for (int64_t d = 0; d < D; d++)
                    for (int64_t r = 0; r < w; r++) col[d * n + r] *= total[r];
            }
        }
}

/* (v, key) before (w, other) in a top-k: the larger value, of equal values the earlier key. */
static inline int before(float v, int64_t key, float w, int64_t other) { return v > w || (v == w && key < other); }

/* Offer (x, key) to the k best (tv, ti: best first, filled with (-1, none) to begin). */
static inline void offer(float *restrict tv, int64_t *restrict ti, int64_t k, float x, int64_t key) {
    if (!before(x, key, tv[k - 1], ti[k - 1])) return;
    int64_t at = k - 1;
    while (at > 0 && before(x, key, tv[at - 1], ti[at - 1])) {
        tv[at] = tv[at - 1];
        ti[at] = ti[at - 1];
        at--;
    }
    tv[at] = x;
    ti[at] = key;
}

static inline void clear(float *tv, int64_t *ti, int64_t k) {
    for (int64_t n = 0; n < k; n++) {
        tv[n] = -1.f;
        ti[n] = INT64_MAX;
    }
}

#ifdef __AVX2__
#include <immintrin.h>

/* Eight vectors' lanes summed (or max'd) each: lane n of the result is vector n's — a tree of
   pairwise steps (shuffles, no horizontal operation per vector). */
#define PAIRS(op, a, b) op(_mm256_shuffle_ps(a, b, 0x88), _mm256_shuffle_ps(a, b, 0xDD))
#define EIGHT(op, v, out)                                                                              \
    do {                                                                                                \
        __m256 t0 = PAIRS(op, v[0], v[1]), t1 = PAIRS(op, v[2], v[3]), t2 = PAIRS(op, v[4], v[5]),       \
               t3 = PAIRS(op, v[6], v[7]);                                                              \
        __m256 u0 = PAIRS(op, t0, t1), u1 = PAIRS(op, t2, t3);                                          \
        out = op(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));          \
    } while (0)

/* How many of x[0..n) are >= t (sixteen lanes a step with AVX-512, else eight; no branch). */
static inline int64_t at_least(const float *restrict x, int64_t n, float t) {
    int64_t count = 0, i = 0;
#ifdef __AVX512F__
    __m512 tw = _mm512_set1_ps(t);
    for (; i + 16 <= n; i += 16)
        count += __builtin_popcount((unsigned)_mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), tw, _CMP_GE_OQ));
#endif
    __m256 tv = _mm256_set1_ps(t);
    for (; i + 8 <= n; i += 8)
        count += __builtin_popcount((unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), tv, _CMP_GE_OQ)));
    for (; i < n; i++) count += x[i] >= t;
    return count;
}

/* A lower bound within 2^-7 of the k-th largest of x[0..n) (1 <= k < n) when every x is a
   non-negative float (a weight), else -1: a binary search over the values' bit patterns — ordered
   as the floats are when none is negative — for a t with at least k of x >= t, stopped once the
   interval is KTH_BITS patterns wide (no data-dependent branch: a selection's mispredictions cost
   more). It starts from the smallest of the maxima of k groups of x (each group holds a value at
   least that: a lower bound to begin with, usually within a few binary orders of the answer — ~6
   counting passes where a search from 0 took ~14). Any t <= the k-th largest block maximum gives
   the same top-k, a slightly lower one only a few more candidates: the 16 halvings saved took
   14-23 % off a chunk's top-k at 1k and 4k keys, sharp rows or flat ones (AMD EPYC, one thread). */
#define KTH_BITS 65536
/* A row's candidates — its weights >= t of the blocks whose maximum is >= t — are gathered while there
   are at most SELECT_CAP of them (else offer_above's insertions), narrowed to those >= the k-th largest
   of them (narrowed(): a second bound, within 2^-7 of it, from the candidates alone, in L1) where there
   are more than NARROW_ABOVE, and ranked (rank_select, whose cost grows as their square) — for every
   k: the block bound alone passes half a row's blocks for k = 16 at 1k keys (blocks of 8). SmolLM2
   bfloat16's chunks (four each, the two builds interleaved in one process, best of 7, Intel Xeon with
   AMX): k = 16 at 1k keys 17.0 -> 15.4 ms, at 4k 17.3 -> 14.0; k = 6 at 4k 10.7 -> 10.6; k = 3 9.7
   -> 9.3 (where k < 6 had been inserted); rows of 4,096 equal weights, k = 3: 6.5 -> 7.7 (slower:
   gathered past the cap, then offered from the row). */
#define SELECT_CAP 1024
#define NARROW_ABOVE(k) (2 * (k) + 8)
/* More than RANK_CAP left (a row flat or tied at its k-th weight): offered in key order instead —
   a tie refused by one comparison, where ranking costs the square of their number. */
#define RANK_CAP 192
static float kth_largest(const float *restrict x, int64_t n, int64_t k) {
    uint32_t lo = UINT32_MAX, hi = 0;
    /* group g is x[n·g/k .. n·(g+1)/k): its end stepped on by n / k and, each time the remainders
       n % k add up past k, one more — the same bounds without a division a group (two idivs a group
       had been a third of this function's time at k = 16) */
    const int64_t step = n / k, rest = n % k;
    int64_t end = 0, carried = 0;
    for (int64_t g = 0; g < k; g++) {
        int64_t i = end;
        end += step;
        carried += rest;
        if (carried >= k) {
            carried -= k;
            end++;
        }
        uint32_t top = 0; /* the group's largest bits */
        for (; i < end; i++) {
            uint32_t b;
            memcpy(&b, x + i, sizeof b);
            top = b > top ? b : top;
        }
        lo = top < lo ? top : lo;
        hi = top > hi ? top : hi;
    }
    if (hi > 0x7f800000u) return -1.f; /* a sign bit or a NaN among them: not weights (tested on the bits:
                                          -ffast-math folds float tests for NaN away) */
    hi += 1; /* the largest's bits + 1: at_least(lo) >= k > at_least(hi) */
    while (hi - lo > KTH_BITS) {
        uint32_t mid = lo + (hi - lo) / 2;
        float t;
        memcpy(&t, &mid, sizeof t);
        if (at_least(x, n, t) >= k)
            lo = mid;
        else
            hi = mid;
    }
    float t;
    memcpy(&t, &lo, sizeof t);
    return t;
}

#ifdef __AVX512F__
/* One step of a bitonic sort of sixteen lanes, largest first: lane i against lane i ^ d, the lanes
   whose bit is set in `larger` keeping the larger of the two. */
#define SORT_STEP(v, d, larger)                                                                         \
    do {                                                                                                \
        __m512 w_ = _mm512_permutexvar_ps(_mm512_xor_si512(lanes, _mm512_set1_epi32(d)), v);            \
        v = _mm512_mask_blend_ps((__mmask16)(larger), _mm512_min_ps(v, w_), _mm512_max_ps(v, w_));      \
    } while (0)
/* the last four steps: a bitonic sequence of sixteen sorted, largest first */
#define MERGE16(v)                                                                                      \
    do {                                                                                                \
        SORT_STEP(v, 8, 0x00ff);                                                                        \
        SORT_STEP(v, 4, 0x0f0f);                                                                        \
        SORT_STEP(v, 2, 0x3333);                                                                        \
        SORT_STEP(v, 1, 0x5555);                                                                        \
    } while (0)
/* The most values kth_of_few reads: beyond, kth_largest's counting passes cost less than its sorts. */
#define FEW_VALUES 256

/* The exact k-th largest of x[0..n) (1 <= k <= 16, k < n <= FEW_VALUES) when every x is a
   non-negative float (a weight), else -1: the sixteen largest kept in one vector, largest first —
   each sixteen of x sorted by a bitonic network and merged in (the larger of each lane and the
   reversed run's, then the network's last four steps). A row's block maxima (64-128 at 1k keys, k
   = 16): about half the time of kth_largest's ~10 counting passes and its groups' scan, and exact
   — a tighter bound, the same top-k. */
static float kth_of_few(const float *restrict x, int64_t n, int64_t k) {
    const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i reverse = _mm512_setr_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512 none = _mm512_set1_ps(-1.f); /* below every weight: the last run's missing lanes */
    __m512 top = none;
    __m512i bits = _mm512_setzero_si512(); /* the largest bit pattern: a sign bit or a NaN shows in it */
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 real = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_mask_loadu_ps(none, real, x + i);
        bits = _mm512_max_epu32(bits, _mm512_maskz_loadu_epi32(real, x + i));
        SORT_STEP(v, 1, 0x9999);
        SORT_STEP(v, 2, 0xc3c3);
        SORT_STEP(v, 1, 0xa5a5);
        SORT_STEP(v, 4, 0xf00f);
        SORT_STEP(v, 2, 0xcc33);
        SORT_STEP(v, 1, 0xaa55);
        MERGE16(v);
        if (i == 0) {
            top = v;
        } else {
            top = _mm512_max_ps(top, _mm512_permutexvar_ps(reverse, v));
            MERGE16(top);
        }
    }
    if (_mm512_reduce_max_epu32(bits) > 0x7f800000u) return -1.f; /* not weights (tested on the bits:
                                                                      -ffast-math folds float tests for NaN away) */
    float sorted[16];
    _mm512_storeu_ps(sorted, top);
    return sorted[k - 1];
}
#undef MERGE16
#undef SORT_STEP

/* A bound for the top-k: kth_of_few's exact k-th largest where it applies, else kth_largest's. */
static inline float kth_bound(const float *restrict x, int64_t n, int64_t k) {
    return k <= 16 && n <= FEW_VALUES ? kth_of_few(x, n, k) : kth_largest(x, n, k);
}
#else
static inline float kth_bound(const float *restrict x, int64_t n, int64_t k) { return kth_largest(x, n, k); }
#endif

/* Offer the weights >= t of the blocks (nb of `block` keys, rm their maxima) whose maximum is >= t,
   in key order: the blocks found eight at a time by one comparison of their maxima, the weights of
   a whole block of 8 or 16 keys eight at a time — each a bit mask walked bit by bit, where a branch
   a block and a key was mispredicted at every candidate (a third of the top-k's time at 1k keys). */
/* x >= t lane by lane, or x > t where strict */
#define PASSES(x, t, strict) ((strict) ? _mm256_cmp_ps(x, t, _CMP_GT_OQ) : _mm256_cmp_ps(x, t, _CMP_GE_OQ))
static inline void offer_above(const float *restrict p, const float *restrict rm, int64_t nb, int64_t K,
                               int64_t block, float t, int strict, float *restrict tv, int64_t *restrict ti,
                               int64_t k) {
    __m256 at_least_t = _mm256_set1_ps(t);
    for (int64_t m0 = 0; m0 < nb; m0 += 8) {
        unsigned blocks = 0;
        if (m0 + 8 <= nb)
            blocks = (unsigned)_mm256_movemask_ps(PASSES(_mm256_loadu_ps(rm + m0), at_least_t, strict));
        else
            for (int64_t m = m0; m < nb; m++) blocks |= (unsigned)(strict ? rm[m] > t : rm[m] >= t) << (m - m0);
        while (blocks) {
            int64_t m = m0 + __builtin_ctz(blocks);
            blocks &= blocks - 1;
            int64_t a = m * block, b = a + block < K ? a + block : K;
            if ((block == 8 || block == 16) && b - a == block) {
                for (int64_t v = a; v < b; v += 8) {
                    unsigned keys = (unsigned)_mm256_movemask_ps(PASSES(_mm256_loadu_ps(p + v), at_least_t, strict));
                    while (keys) {
                        int64_t j = v + __builtin_ctz(keys);
                        keys &= keys - 1;
                        offer(tv, ti, k, p[j], j);
                    }
                }
            } else {
                for (int64_t j = a; j < b; j++)
                    if (strict ? p[j] > t : p[j] >= t) offer(tv, ti, k, p[j], j);
            }
        }
    }
}

/* The candidates offer_above(..., t, 0, ...) would offer — the weights >= t of the blocks whose
   maximum is >= t — written in key order into cv (values) and ck (keys), room for cap + 8 each:
   returns how many there are, or, as soon as there are more than cap, that many (a flat row's
   thousands are not counted to the end: the caller offers them from the row). */
static inline int64_t gather_above(const float *restrict p, const float *restrict rm, int64_t nb, int64_t K,
                                   int64_t block, float t, float *restrict cv, int32_t *restrict ck, int64_t cap) {
    __m256 at_least_t = _mm256_set1_ps(t);
    int64_t n = 0;
    for (int64_t m0 = 0; m0 < nb; m0 += 8) {
        unsigned blocks = 0;
        if (m0 + 8 <= nb)
            blocks = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(rm + m0), at_least_t, _CMP_GE_OQ));
        else
            for (int64_t m = m0; m < nb; m++) blocks |= (unsigned)(rm[m] >= t) << (m - m0);
        while (blocks) {
            int64_t m = m0 + __builtin_ctz(blocks);
            blocks &= blocks - 1;
            int64_t a = m * block, b = a + block < K ? a + block : K;
            for (int64_t v = a; v < b; v += 8) {
                unsigned keys;
                if (v + 8 <= b)
                    keys = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(p + v), at_least_t, _CMP_GE_OQ));
                else {
                    keys = 0;
                    for (int64_t j = v; j < b; j++) keys |= (unsigned)(p[j] >= t) << (j - v);
                }
                if (n > cap) return n; /* past the buffer: more than it holds (the eight below fit while n <= cap) */
#if defined(__AVX512F__) && defined(__AVX512VL__)
                if (v + 8 <= b) { /* the passing lanes packed in a register and stored whole (the lanes after
                                     them are overwritten next; a compressing store to memory is microcoded on
                                     AMD's Zen 4: 40 % slower than the scalar loop) — no branch a key */
                    _mm256_storeu_ps(cv + n, _mm256_maskz_compress_ps((__mmask8)keys, _mm256_loadu_ps(p + v)));
                    _mm256_storeu_si256((__m256i *)(ck + n),
                                        _mm256_maskz_compress_epi32((__mmask8)keys,
                                                                    _mm256_add_epi32(_mm256_set1_epi32((int32_t)v),
                                                                                     _mm256_setr_epi32(0, 1, 2, 3, 4,
                                                                                                       5, 6, 7))));
                    n += __builtin_popcount(keys);
                    continue;
                }
#endif
                while (keys) {
                    int64_t j = v + __builtin_ctz(keys);
                    keys &= keys - 1;
                    cv[n] = p[j];
                    ck[n] = (int32_t)j;
                    n++;
                }
            }
        }
    }
    return n;
}

/* The k best of n >= k candidates (cv, ck: in key order, cv padded with -1 to a whole number of
   vectors) placed at their ranks in tv, ti: candidate i's rank is how many come before it — a
   larger weight, or an equal one at an earlier key (earlier in cv) — the order offer() keeps, so
   the same top-k; ranks are distinct, so the k slots are each written once. No insertion (a
   candidate shifted the list it entered: ~40 % of a 1k row's pooling at k = 16). */
static inline void rank_select(const float *restrict cv, const int32_t *restrict ck, int64_t n, int64_t k,
                               float *restrict tv, int64_t *restrict ti) {
#ifdef __AVX512F__
    /* sixteen candidates i at a time, each j broadcast against them: ranks grow lane by lane */
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int64_t i0 = 0; i0 < n; i0 += 16) {
        __m512 x = _mm512_loadu_ps(cv + i0);
        __m512i at = _mm512_add_epi32(lane, _mm512_set1_epi32((int32_t)i0)); /* each lane's i */
        __m512i rank = _mm512_setzero_si512();
        const __m512i one = _mm512_set1_epi32(1);
        for (int64_t j = 0; j < n; j++) {
            __m512 y = _mm512_set1_ps(cv[j]);
            __mmask16 larger = _mm512_cmp_ps_mask(y, x, _CMP_GT_OQ);
            __mmask16 tied_earlier = _mm512_mask_cmp_ps_mask(_mm512_cmpgt_epi32_mask(at, _mm512_set1_epi32((int32_t)j)),
                                                             y, x, _CMP_EQ_OQ);
            rank = _mm512_mask_add_epi32(rank, larger | tied_earlier, rank, one);
        }
        int32_t r[16];
        _mm512_storeu_si512(r, rank);
        for (int64_t l = 0; l < 16 && i0 + l < n; l++)
            if (r[l] < k) {
                tv[r[l]] = cv[i0 + l];
                ti[r[l]] = ck[i0 + l];
            }
    }
#else
    /* eight candidates i at a time, each j broadcast against them (a lane's compare is all ones: -1) */
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t i0 = 0; i0 < n; i0 += 8) {
        __m256 x = _mm256_loadu_ps(cv + i0);
        __m256i at = _mm256_add_epi32(lane, _mm256_set1_epi32((int32_t)i0)); /* each lane's i */
        __m256i rank = _mm256_setzero_si256();
        for (int64_t j = 0; j < n; j++) {
            __m256 y = _mm256_set1_ps(cv[j]);
            __m256i larger = _mm256_castps_si256(_mm256_cmp_ps(y, x, _CMP_GT_OQ));
            __m256i tied_earlier = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(y, x, _CMP_EQ_OQ)),
                                                    _mm256_cmpgt_epi32(at, _mm256_set1_epi32((int32_t)j)));
            rank = _mm256_sub_epi32(rank, _mm256_or_si256(larger, tied_earlier));
        }
        int32_t r[8];
        _mm256_storeu_si256((__m256i *)r, rank);
        for (int64_t l = 0; l < 8 && i0 + l < n; l++)
            if (r[l] < k) {
                tv[r[l]] = cv[i0 + l];
                ti[r[l]] = ck[i0 + l];
            }
    }
#endif
}

/* cv, ck (n candidates in key order, values weights) cut to those >= their k-th largest (kth_bound:
   exact, or a lower bound within 2^-7 of it): the same top-k and ties, in key order; returns how many
   stay. Few candidates (at most NARROW_ABOVE(k)) are left as they are. */
static inline int64_t narrowed(float *restrict cv, int32_t *restrict ck, int64_t n, int64_t k) {
    if (n <= NARROW_ABOVE(k)) return n;
    float t = kth_bound(cv, n, k);
    if (t <= 0.f) return n; /* a bound of 0 (the k-th is 0 or nearly) keeps every one */
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) { /* no branch a candidate: each written, kept where it passes */
        cv[m] = cv[i];
        ck[m] = ck[i];
        m += cv[i] >= t;
    }
    return m;
}

/* After offer_above(..., 0, strict): the zero weights a row of fewer than k positive ones still
   needs, first keys first (offered after every positive weight, each goes to the end). */
static inline void offer_zeros(const float *restrict p, int64_t K, float *restrict tv, int64_t *restrict ti,
                               int64_t k) {
    int64_t missing = 0;
    for (int64_t n = 0; n < k; n++) missing += tv[n] < 0.f;
    for (int64_t j = 0; j < K && missing > 0; j++)
        if (p[j] == 0.f) {
            offer(tv, ti, k, 0.f, j);
            missing--;
        }
}

/* Blocks of 8 or 16 keys (vectors: 1 or 2 a block), eight at a time while eight fit in K: their
   sums and maxima; returns the first block not done. */
static int64_t eight_blocks(const float *restrict p, int64_t K, int64_t block, float *restrict rs,
                            float *restrict rm) {
    int64_t n = 0;
    for (; (n + 8) * block <= K; n += 8) {
        __m256 sums[8], maxima[8];
        for (int v = 0; v < 8; v++) {
            const float *q = p + (n + v) * block;
            __m256 x = _mm256_loadu_ps(q);
            if (block == 16) {
                __m256 y = _mm256_loadu_ps(q + 8);
                sums[v] = _mm256_add_ps(x, y);
                maxima[v] = _mm256_max_ps(x, y);
            } else {
                sums[v] = maxima[v] = x;
            }
        }
        __m256 s, m;
        EIGHT(_mm256_add_ps, sums, s);
        EIGHT(_mm256_max_ps, maxima, m);
        _mm256_storeu_ps(rs + n, s);
        _mm256_storeu_ps(rm + n, m);
    }
    return n;
}
#endif

/* Whether x[0..n) are all weights: none negative, none NaN (tested on the bits: -ffast-math folds
   float tests for NaN away). */
static inline int weights_only(const float *restrict x, int64_t n) {
    uint32_t hi = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, x + i, sizeof b);
        hi = b > hi ? b : hi;
    }
    return hi <= 0x7f800000u;
}

/* A row's nb block sums and maxima, `pool` blocks a cell, added into ms and max'd into lg (its
   cells): pool a constant where inlined, so that each body vectorises (a scalar loop a cell was a
   seventh of the page's time at 1k keys, pool 1). */
static inline __attribute__((always_inline)) void cells_of(const float *restrict rs, const float *restrict rm,
                                                           int64_t nb, int64_t pool, float *restrict ms,
                                                           float *restrict lg) {
    for (int64_t cell = 0; cell * pool < nb; cell++) {
        int64_t a = cell * pool, b = a + pool < nb ? a + pool : nb;
        float s = 0.f, m = 0.f;
        for (int64_t j = a; j < b; j++) {
            s += rs[j];
            m = fmaxf(m, rm[j]);
        }
        ms[cell] += s;
        lg[cell] = fmaxf(lg[cell], m);
    }
}

static void add_cells(const float *rs, const float *rm, int64_t nb, int64_t pool, float *ms, float *lg) {
    if (pool == 1) {
        for (int64_t j = 0; j < nb; j++) {
            ms[j] += rs[j];
            lg[j] = fmaxf(lg[j], fmaxf(0.f, rm[j]));
        }
    } else if (pool == 2) {
        cells_of(rs, rm, nb, 2, ms, lg);
    } else if (pool == 4) {
        cells_of(rs, rm, nb, 4, ms, lg);
    } else {
        cells_of(rs, rm, nb, pool, ms, lg);
    }
}

/* Rows [row0, row1) of the H*C rows of one text's chunk (w: (H, C, K) with strides hstride and
   kstride between heads and rows), as a page pools them: each row's sums and maxima over blocks of
   `block` keys (sums, maxima: the row's scratch, nb = ceil(K / block) each), its blocks, `pool` at
   a time (cells of pool·block keys), added into mass and max'd into largest (H, nrb, cells) at the
   row's block of pool·block query rows, less rb0 (the chunk's rows are start..start+C-1: its row
   blocks rb0..rb0+nrb-1); and its k largest weights, largest first (top (H, C, k) float32, where
   (H, C, k) int64 keys). Equal weights: the first key met is kept. extent (H, C) int32, or null:
   each row's keys from extent[row] on weigh exactly 0 (those it may not see: a causal row's later
   keys) and are not read — their blocks would add 0 to the cells, and the top-k takes the zeros it
   needs first key first — unless a block before it sums to NaN or less than 0 (an eager softmax's
   NaN row is NaN at every key): that row is read whole, as without extents. Blocks of 8 or 16 keys
   go eight at a time through vector lanes where the CPU has AVX2 (a horizontal sum a block cost
   more than its keys). */
static void rows_pooled(const float *w, int64_t C, int64_t K, int64_t hstride, int64_t kstride, int64_t block,
                        int64_t k, int64_t row0, int64_t row1, float *sums, float *maxima, float *top, int64_t *where,
                        int64_t start, int64_t pool, int64_t cells, int64_t rb0, int64_t nrb, float *mass,
                        float *largest, const int32_t *extent) {
    float bv[64]; /* the k blocks of largest maxima */
    int64_t bk[64];
#ifdef __AVX2__
    float cv[SELECT_CAP + 16]; /* a row's candidates for rank_select, padded to whole vectors */
    int32_t ck[SELECT_CAP + 8];
#endif
    for (int64_t row = row0; row < row1; row++) {
        const float *p = w + (row / C) * hstride + (row % C) * kstride;
        float *rs = sums, *rm = maxima;
        int64_t E = K; /* the keys read: a whole number of blocks, or K */
#ifdef __AVX2__
        if (extent && extent[row] > 0 && extent[row] < K) E = (extent[row] + block - 1) / block * block;
        E = E < K ? E : K;
#endif
    again:;
        int64_t nb = (E + block - 1) / block, n = 0;
#ifdef __AVX2__
        if (block == 8 || block == 16) n = eight_blocks(p, E, block, rs, rm);
#endif
        for (; n < nb; n++) {
            int64_t a = n * block, b = a + block < E ? a + block : E;
            float s = 0.f, m = -1.f;
            for (int64_t j = a; j < b; j++) {
                s += p[j];
                m = fmaxf(m, p[j]);
            }
            rs[n] = s;
            rm[n] = m;
        }
        if (E < K && !(weights_only(rs, nb) && weights_only(rm, nb))) { /* a NaN (its block's sum is NaN) or a
                                                                          negative: the whole row, as without extents */
            E = K;
            goto again;
        }
        /* the row's cells: its blocks `pool` at a time, at its row block */
        int64_t at = ((row / C) * nrb + (start + row % C) / (pool * block) - rb0) * cells;
        add_cells(rs, rm, nb, pool, mass + at, largest + at);
        float *tv = top + row * k;
        int64_t *ti = where + row * k;
#ifdef __AVX2__
        /* for every k: offering the blocks in order costs a sorted insertion a block where the maxima
           grow along the row (recency), as they do in causal maps — k = 6, rows of 4,096 keys: 0.77 ns
           a weight that way, 0.33 this way (AMD EPYC, two threads). t, at most the k-th largest block
           maximum, bounds the k-th largest weight from below (k blocks hold a weight >= t): the k
           largest weights, and every weight tied with the k-th, are among the weights >= t of the
           blocks whose maximum is >= t. A row read in k blocks or fewer (a causal chunk's first rows)
           takes its bound from its weights themselves (it had offered every one of them) */
        float t = -1.f;
        if (nb > k)
            t = kth_bound(rm, nb, k);
        else if (E < K && weights_only(rm, nb)) { /* blocks of weights only: a NaN or a negative sum was read to K */
            t = E > k ? kth_largest(p, E, k) : 0.f;
            if (t < 0.f) /* a negative weight in a block whose sum and maximum are not (no softmax's): below */
                t = 0.f;
        }
        if (t > 0.f) {
            int64_t n = gather_above(p, rm, nb, E, block, t, cv, ck, SELECT_CAP);
            if (n <= SELECT_CAP) { /* n >= k: k blocks (or keys) hold a weight >= t */
                n = narrowed(cv, ck, n, k);
                if (n <= RANK_CAP) {
                    for (int64_t pad = n; pad < (n + 15) / 16 * 16; pad++) cv[pad] = -1.f;
                    rank_select(cv, ck, n, k, tv, ti);
                } else { /* many tied with the k-th (a flat row): in key order, each tie refused at once */
                    clear(tv, ti, k);
                    for (int64_t c = 0; c < n; c++) offer(tv, ti, k, cv[c], ck[c]);
                }
                continue;
            }
            clear(tv, ti, k);
            offer_above(p, rm, nb, E, block, t, 0, tv, ti, k);
            continue;
        }
        if (t == 0.f) { /* fewer than k blocks hold a positive weight (a causal row's first keys): every
                           weight would pass t — the positive ones are offered, then the zeros the row
                           still needs, first key first (a causal chunk's first rows had offered each of
                           their K keys); a row read whole in fewer than k blocks takes the path below */
            clear(tv, ti, k);
            offer_above(p, rm, nb, E, block, 0.f, 1, tv, ti, k);
            offer_zeros(p, K, tv, ti, k);
            continue;
        }
#endif
        /* the k-th largest block maximum bounds the k-th largest weight from below, so the k largest
           weights lie in the k blocks of largest maxima (or, tied, in others): those blocks, largest
           maximum first, until one's maximum is below the k-th largest weight found (E = K here) */
        int64_t nk = nb < k ? nb : k;
        clear(bv, bk, nk);
        for (int64_t m = 0; m < nb; m++) offer(bv, bk, nk, rm[m], m);
        clear(tv, ti, k);
        for (int64_t m = 0; m < nk && bv[m] >= tv[k - 1]; m++) {
            int64_t a = bk[m] * block, b = a + block < K ? a + block : K;
            for (int64_t j = a; j < b; j++) offer(tv, ti, k, p[j], j);
        }
    }
}

/* A text's rows of a chunk as a page pools them: rows_pooled's arguments (`text`: its row of the chunk,
   for read_chunk). Each part n reads into its own scratch (sums, maxima + n·ceil(K / block)) and its
   own cells (mass, largest + n·H·nrb·cells), summed and max'd by the caller; each row's top-k is its own. */
typedef struct {
    const float *w; /* the text's (H, C, K) of the chunk, strides hstride and kstride */
    int64_t text, C, K, hstride, kstride, block, k;
    float *sums, *maxima; /* (parts, ceil(K / block)) scratch */
    float *top;
    int64_t *where;
    int64_t start, pool, cells, rb0, nrb;
    float *mass, *largest; /* (parts, H, nrb, cells) */
    const int32_t *extent;
    int64_t H;
} pooled_pass;

/* rows [row0, row1) of the text's H·C rows, into part n's scratch and cells */
static void pooled_rows(const pooled_pass *x, int64_t row0, int64_t row1, int64_t n) {
    const int64_t nb = (x->K + x->block - 1) / x->block, area = x->H * x->nrb * x->cells;
    rows_pooled(x->w, x->C, x->K, x->hstride, x->kstride, x->block, x->k, row0, row1, x->sums + n * nb,
                x->maxima + n * nb, x->top, x->where, x->start, x->pool, x->cells, x->rb0, x->nrb, x->mass + n * area,
                x->largest + n * area, x->extent);
}

/* pooled_rows over rows [row0, row1) in `parts` ranges, the n-th into part `part` + n. */
void row_pooled(const pooled_pass *x, int64_t row0, int64_t row1, int64_t parts, int64_t part) {
    IN_PARTS
    for (int64_t n = 0; n < parts; n++)
        pooled_rows(x, part_bound(row0, row1, n, parts), part_bound(row0, row1, n + 1, parts), part + n);
}

/* The key of the largest of a word-summed row a (keys 0..K-1): lone[j] marks the keys that are a
   whole word, multi (M, 2) the (first key, keys) of the longer words in key order. Ties: the
   earliest word. The maxima of 64-key blocks first (vectorised: of the lone keys, and of all keys),
   then the first key that reaches the largest lone one, then the longer words' sums — only in the
   blocks where one could reach the best so far: the words starting in block n are
   multi[blocks[n] .. blocks[n + 1]), the longest of them longest[n] keys, and L keys each at most the
   largest of blocks n and n + 1 sum to at most L times it (a margin of 1e-5 for float32's rounding
   of up to 64 terms), so a block whose bound is below the best holds no winner, nor a tie. A row's
   weight sits on a few keys: most blocks are passed over, where every word had been summed (a
   scalar loop a word, its length mispredicted) at every word's end. */
static int64_t word_argmax(const float *restrict a, int64_t K, const uint8_t *restrict lone,
                           const int32_t *restrict multi, const int32_t *restrict blocks,
                           const int32_t *restrict longest, float *restrict block_max) {
    int64_t nb = (K + 63) / 64;
    float *restrict all_max = block_max + nb;
    float best = -1.f;
    for (int64_t n = 0; n < nb; n++) {
        int64_t lo = n * 64, hi = lo + 64 < K ? lo + 64 : K;
        float m = -1.f, any = 0.f;
        for (int64_t j = lo; j < hi; j++) {
            m = fmaxf(m, lone[j] ? a[j] : -1.f);
            any = fmaxf(any, a[j]);
        }
        block_max[n] = m;
        all_max[n] = any;
        best = fmaxf(best, m);
    }
    int64_t at = -1;
    for (int64_t n = 0; n < nb && at < 0; n++) {
        if (block_max[n] < best) continue;
        int64_t hi = (n + 1) * 64 < K ? (n + 1) * 64 : K;
        for (int64_t j = n * 64; j < hi; j++) {
            if (lone[j] && a[j] == best) {
                at = j;
                break;
            }
        }
    }
    for (int64_t n = 0; n < nb; n++) {
        int64_t w0 = blocks[n], w1 = blocks[n + 1];
        if (w0 == w1) continue;
        if (longest[n] <= 64) { /* its words end in block n or n + 1 */
            float top = n + 1 < nb && all_max[n + 1] > all_max[n] ? all_max[n + 1] : all_max[n];
            if ((float)longest[n] * top * 1.00001f < best) continue;
        }
        for (int64_t m = w0; m < w1 && multi[2 * m] < K; m++) {
            int64_t first = multi[2 * m], end = first + multi[2 * m + 1] < K ? first + multi[2 * m + 1] : K;
            float s = 0.f;
            for (int64_t j = first; j < end; j++) s += a[j];
            if (s > best || (s == best && (at < 0 || first < at))) {
                best = s;
                at = first;
            }
        }
    }
    return at;
}

static int64_t predicted(const float *a, int64_t K, const int32_t *key_word, const uint8_t *lone,
                         const int32_t *multi, const int32_t *blocks, const int32_t *longest, float *scratch) {
    int64_t at = word_argmax(a, K, lone, multi, blocks, longest, scratch);
    return at >= 0 ? key_word[at] : -1; /* no word among the keys */
}

/* One parsed text's rows c = 0..C-1 of a chunk (w: (H, C, K), strides hstride and kstride), heads
   h0..h1-1: each source word's rows summed (a word's tokens are consecutive rows; row_word (C,)
   each row's word, -1 none), and for every word whose rows end here the word it attends most —
   best (W, H) int64, the word of the arg-max key (key_word (K,)). The word still open at the
   chunk's end, unless `last`, is carried in acc (H, astride) over its first acc_keys keys (the
   next chunk's K >= acc_keys; the keys after had weight 0 in its rows so far); `carried` is the
   word acc holds on entry (-1: none). blocks, longest: the longer words by 64-key block (word_argmax).
   block_max: (H, 2 ceil(K / 64)) scratch. */
typedef struct {
    const float *w;
    int64_t C, K, hstride, kstride;
    const int32_t *row_word, *key_word;
    const uint8_t *lone;
    const int32_t *multi, *blocks, *longest;
    float *acc;
    int64_t astride, carried, acc_keys, last;
    int64_t *best;
    int64_t H;
    float *block_max;
    int64_t text; /* the text's row of the chunk (read_chunk) */
} word_pass;

/* A head's word open so far, and its one row where it has one (read where it is: most words are one
   token, whose row was copied into acc only to be read back — a pass of K a row of the three it took). */
typedef struct {
    int64_t open;
    const float *only;
} open_word;

static void words_begin(const word_pass *x, int64_t h, open_word *s) {
    float *a = x->acc + h * x->astride;
    s->open = x->carried;
    s->only = 0;
    if (s->open >= 0)
        for (int64_t j = x->acc_keys; j < x->K; j++) a[j] = 0.f;
}

static void words_rows(const word_pass *x, int64_t h, int64_t c0, int64_t c1, open_word *s) {
    const int64_t K = x->K, H = x->H;
    float *restrict a = x->acc + h * x->astride;
    float *scratch = x->block_max + h * 2 * ((K + 63) / 64);
    for (int64_t c = c0; c < c1; c++) {
        int64_t word = x->row_word[c];
        if (word < 0) continue;
        const float *restrict p = x->w + h * x->hstride + c * x->kstride;
        if (word != s->open) {
            if (s->open >= 0)
                x->best[s->open * H + h] = predicted(s->only ? s->only : a, K, x->key_word, x->lone, x->multi,
                                                      x->blocks, x->longest, scratch);
            s->open = word;
            s->only = p;
        } else if (s->only) {
            const float *restrict only = s->only;
            for (int64_t j = 0; j < K; j++) a[j] = only[j] + p[j];
            s->only = 0;
        } else {
            for (int64_t j = 0; j < K; j++) a[j] += p[j];
        }
    }
}

static void words_end(const word_pass *x, int64_t h, open_word *s) {
    const int64_t K = x->K;
    float *restrict a = x->acc + h * x->astride;
    if (s->open >= 0 && x->last)
        x->best[s->open * x->H + h] = predicted(s->only ? s->only : a, K, x->key_word, x->lone, x->multi, x->blocks,
                                                x->longest, x->block_max + h * 2 * ((K + 63) / 64));
    else if (s->only) /* carried into the next chunk in a */
        for (int64_t j = 0; j < K; j++) a[j] = s->only[j];
}

static void words_predicted(const word_pass *x, int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; h++) {
        open_word s;
        words_begin(x, h, &s);
        words_rows(x, h, 0, x->C, &s);
        words_end(x, h, &s);
    }
}

/* words_predicted for heads [h0, h1) in `parts` ranges (each head's sums and predictions are its own). */
void word_predictions(const word_pass *x, int64_t h0, int64_t h1, int64_t parts) {
    IN_PARTS
    for (int64_t n = 0; n < parts; n++) words_predicted(x, part_bound(h0, h1, n, parts), part_bound(h0, h1, n + 1, parts));
}


/* ------------------------------------------------------------------------------------------------
   A chunk read once for every reader of it: each (text, head)'s rows a few at a time — their row
   statistics, their page cells and top-k where the text is a page's pooled one, their words where it
   is parsed — while those rows are in cache. Read by each reader in a pass of its own, the chunk's map
   (tens of MB, written just before by the attention) came from memory three times, each pass bound
   by its bandwidth: SmolLM2 bfloat16's 8k-token analysis moved ~36 GB a pass (Xeon, ~22 GB/s). */

#define PASS_ROWS 8 /* rows of a (text, head) read by every reader in turn: 256 KB at 8,192 keys */

/* The B·H·C rows of a chunk (text, head, row) in `parts` ranges — as row_statistics and row_pooled split
   them: the same sums — each range's rows PASS_ROWS at a time: rows_statistics where stats is not null,
   rows_pooled for the text of each of the n_pooled pooled passes, and the words of each of the n_words
   word passes (their `text`). A (text, head)'s words are read in order by the part that holds its first
   row, all of them: the rows of its part first, while in cache, then any that the next part holds (a
   head split between two parts: its rows from memory, once more). stats->columns: each part's own
   (text, head) rows after one another, part n's from row column_at[n] (row_statistics' layout). */
void read_chunk(int64_t B, int64_t H, int64_t C, int64_t parts, const stats_pass *stats, const int64_t *column_at,
                const pooled_pass *pooled, int64_t n_pooled, const word_pass *words, int64_t n_words) {
    IN_PARTS
    for (int64_t n = 0; n < parts; n++) {
        const int64_t r0 = part_bound(0, B * H * C, n, parts), r1 = part_bound(0, B * H * C, n + 1, parts);
        for (int64_t pair = r0 / C; pair < B * H && pair * C < r1; pair++) {
            const int64_t b = pair / H, h = pair % H;
            const int64_t ca = r0 > pair * C ? r0 - pair * C : 0, cb = r1 < (pair + 1) * C ? r1 - pair * C : C;
            const pooled_pass *pool = 0;
            const word_pass *word = 0;
            for (int64_t m = 0; m < n_pooled; m++)
                if (pooled[m].text == b) pool = pooled + m;
            for (int64_t m = 0; m < n_words && ca == 0; m++) /* the words: the part with the head's first row */
                if (words[m].text == b) word = words + m;
            open_word state;
            if (word) words_begin(word, h, &state);
            for (int64_t c0 = ca; c0 < cb; c0 += PASS_ROWS) {
                const int64_t c1 = c0 + PASS_ROWS < cb ? c0 + PASS_ROWS : cb;
                if (stats) stats_rows(stats, column_at, pair * C + c0, pair * C + c1, n, r0 / C);
                if (pool && c0 < pool->C) pooled_rows(pool, h * pool->C + c0, h * pool->C + (c1 < pool->C ? c1 : pool->C), n);
                if (word && c0 < word->C) words_rows(word, h, c0, c1 < word->C ? c1 : word->C, &state);
            }
            if (word) {
                if (cb < word->C) words_rows(word, h, cb, word->C, &state); /* the head's rows the next part reads */
                words_end(word, h, &state);
            }
        }
    }
}
