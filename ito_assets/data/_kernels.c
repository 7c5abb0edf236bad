/* The per-byte and per-shingle loops of deduplication, and the documents' ids' SHA-256, in C:
 * numpy can only run them as whole arrays per byte or per (permutation, shingle), which cost more
 * than the work, and hashlib takes one message a call (kernels.py holds the numpy and hashlib
 * versions, which give the same numbers, and the measurements).
 *
 * Arrays come in through the buffer protocol (no numpy headers), already of the right dtype and
 * C-contiguous (kernels.py sees to it), and the loops run without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__) && !defined(__clang__)
/* The MinHash loop vectorises 8 lanes wide under AVX2 and 4 without it: both are built, the CPU picks. */
#define WIDE_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define WIDE_CLONES
#endif

#define WORD_SEED 0x243F6A8885A308D3ULL  /* pi's fraction: any constant, fixed forever */
#define WORD_PRIME 0x9E3779B97F4A7C15ULL
#define EMPTY_SLOT 0xFFFFFFFFu

/* splitmix64's finaliser, as text.mix64 */
static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* A word's bytes fold in 8 at a time, little-endian, the last block padded with zeros. */
static inline uint64_t fold_block(uint64_t h, uint64_t block) {
    h = (h ^ block) * WORD_PRIME;
    return h ^ (h >> 32);
}

static inline uint64_t finish_word(uint64_t h, uint64_t length) { return mix64(h ^ length); }

static uint64_t hash_bytes(const uint8_t *p, int64_t n) {
    uint64_t h = WORD_SEED, block = 0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        block = 0;
        for (int k = 0; k < 8; k++) block |= (uint64_t)p[i + k] << (8 * k);
        h = fold_block(h, block);
    }
    if (i < n) {
        block = 0;
        for (int k = 0; i + k < n; k++) block |= (uint64_t)p[i + k] << (8 * k);
        h = fold_block(h, block);
    }
    return finish_word(h, (uint64_t)n);
}

typedef struct {
    Py_buffer view;
    int held, writable;
} Buf;

static int take(PyObject *obj, Buf *buf, Py_ssize_t itemsize, int writable, const char *name) {
    if (PyObject_GetBuffer(obj, &buf->view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) return -1;
    buf->held = 1;
    buf->writable = writable;
    if (buf->view.len % itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes is no whole number of %zd-byte items", name, buf->view.len, itemsize);
        return -1;
    }
    return 0;
}

/* An output that shares memory with another array would change what was checked: refused. */
static int apart(Buf *bufs, int n) {
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            const char *a = bufs[i].view.buf, *b = bufs[j].view.buf;
            if ((bufs[i].writable || bufs[j].writable) && bufs[i].view.len && bufs[j].view.len && a < b + bufs[j].view.len &&
                b < a + bufs[i].view.len) {
                PyErr_SetString(PyExc_ValueError, "an output shares memory with another array");
                return -1;
            }
        }
    return 0;
}

static void release(Buf *bufs, int n) {
    for (int i = 0; i < n; i++)
        if (bufs[i].held) PyBuffer_Release(&bufs[i].view);
}

/* What a kernel says when a position it checked is out of range when used: another thread wrote
 * the array while the kernel ran without the GIL. The newer kernels check each position again as
 * they use it; a crafted call from two threads gets this error, not a read out of bounds. */
#define CHANGED "an input array changed while the kernel ran (another thread wrote it)"

/* The buffers released and the call refused with `message`: NULL, for the kernel to return. */
static PyObject *refuse(Buf *bufs, int n, const char *message) {
    release(bufs, n);
    PyErr_SetString(PyExc_ValueError, message);
    return NULL;
}

/* The buffers released at a kernel's end: None, or the refusal when an input changed under it. */
static PyObject *finish(Buf *bufs, int n, int changed) {
    if (changed) return refuse(bufs, n, CHANGED);
    release(bufs, n);
    Py_RETURN_NONE;
}

/* One argument array: its name in messages, its item size, whether the kernel writes it. */
typedef struct {
    const char *name;
    Py_ssize_t itemsize;
    int writable;
} Arg;

/* Every argument's buffer taken as `args` says, and kept apart: on failure all released, -1. */
static int take_all(PyObject **objs, Buf *bufs, const Arg *args, int n) {
    memset(bufs, 0, sizeof *bufs * (size_t)n);
    for (int i = 0; i < n; i++)
        if (take(objs[i], &bufs[i], args[i].itemsize, args[i].writable, args[i].name)) {
            release(bufs, n);
            return -1;
        }
    if (apart(bufs, n)) {
        release(bufs, n);
        return -1;
    }
    return 0;
}

/* Words are read 8 bytes at a time as one little-endian integer, a byte a lane: on a big-endian
 * machine the build fails and numpy's versions run. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the word kernels read 8 bytes as a little-endian integer"
#endif

#define LANES(byte) (0x0101010101010101ULL * (uint64_t)(byte))
#define LANE_TOPS LANES(0x80)

/* The bytes data[i:end], at most 8, as one integer; lanes past `end` are zero (no word's byte). */
static inline uint64_t load_upto(const uint8_t *data, int64_t i, int64_t end) {
    uint64_t x = 0;
    if (end - i >= 8) {
        memcpy(&x, data + i, 8);  /* a constant size: one unaligned load */
        return x;
    }
    for (int k = 0; i + k < end; k++) x |= (uint64_t)data[i + k] << (8 * k);
    return x;
}

/* The lanes of x (bit 7 of each byte) that a word holds: [0-9A-Za-z] and every non-ASCII byte;
 * `letters`: the ASCII letters' lanes. Within a lane the sums stay below 0x100, so no carry
 * crosses into the next. */
static inline uint64_t word_lanes(uint64_t x, uint64_t *letters) {
    uint64_t high = x & LANE_TOPS, low = x & LANES(0x7F), folded = low | LANES(0x20);
    uint64_t digit = (low + LANES(0x80 - '0')) & ~(low + LANES(0x7F - '9'));
    uint64_t letter = (folded + LANES(0x80 - 'a')) & ~(folded + LANES(0x7F - 'z'));
    *letters = letter & ~high & LANE_TOPS;
    return (high | digit | letter) & LANE_TOPS;
}

/* word_runs(data: u8, bounds: i64 (N+1), hashes: u64 out, offsets: i64 out (N+1), runs: i64 out (3R))
 * -> (words, R). The runs of [0-9A-Za-z] and non-ASCII bytes of N texts laid end to end in `data`
 * (text i is data[bounds[i]:bounds[i+1]]); a run never crosses a text's end. A run of ASCII alone
 * is a word: lower cased and hashed into `hashes`. A run holding a non-ASCII byte is left to the
 * caller, who knows Unicode: its place in `hashes` holds 0 and `runs` gets (start, end, place). */
static PyObject *word_runs(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *objs[5];
    Buf b[5];
    static const Arg ARGS[] = {{"data", 1, 0}, {"bounds", 8, 0}, {"hashes", 8, 1}, {"offsets", 8, 1}, {"runs", 8, 1}};
    if (!PyArg_ParseTuple(args, "OOOOO", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4])) return NULL;
    if (take_all(objs, b, ARGS, 5)) return NULL;
    const uint8_t *data = b[0].view.buf;
    const int64_t *bounds = b[1].view.buf;
    uint64_t *hashes = b[2].view.buf;
    int64_t *offsets = b[3].view.buf, *runs = b[4].view.buf;
    Py_ssize_t num_bounds = b[1].view.len / 8, capacity = b[2].view.len / 8, run_capacity = b[4].view.len / 24;
    int bad = num_bounds < 1 || b[3].view.len / 8 != num_bounds || bounds[0] < 0 || bounds[num_bounds - 1] > b[0].view.len;
    for (Py_ssize_t d = 0; !bad && d + 1 < num_bounds; d++) bad = bounds[d] > bounds[d + 1];
    if (bad) {
        return refuse(b, 5, "bounds must be N+1 ascending positions within data, offsets N+1 long");
    }
    Py_ssize_t words = 0, num_runs = 0, data_length = b[0].view.len;
    int overflow = 0, changed = 0;
    Py_BEGIN_ALLOW_THREADS
    offsets[0] = 0;
    for (Py_ssize_t d = 0; d + 1 < num_bounds && !overflow && !changed; d++) {
        int64_t i = bounds[d], end = bounds[d + 1];
        if (i < 0 || i > end || end > data_length) {  /* checked above, but another thread may write them now */
            changed = 1;
            break;
        }
        while (i < end) {
            uint64_t letters, x = load_upto(data, i, end), lanes = word_lanes(x, &letters);
            if (!lanes) {
                i += 8;
                continue;
            }
            int first = __builtin_ctzll(lanes) >> 3;
            uint64_t gaps = ~lanes & LANE_TOPS & (~0ULL << (8 * first));
            int64_t start = i + first;
            uint64_t h = WORD_SEED, non_ascii = 0;
            if (gaps) {
                /* The run ends inside these 8 bytes (most words): hashed from them, no second read. */
                int last = __builtin_ctzll(gaps) >> 3;
                uint64_t keep = (1ULL << (8 * (last - first))) - 1;
                non_ascii = (x >> (8 * first)) & keep & LANE_TOPS;
                h = fold_block(h, ((x | letters >> 2) >> (8 * first)) & keep);  /* bit 0x20 set on the letters: lower case */
                i += last;
            } else {
                for (i = start;;) {
                    x = load_upto(data, i, end);
                    gaps = ~word_lanes(x, &letters) & LANE_TOPS;
                    int run = gaps ? __builtin_ctzll(gaps) >> 3 : 8;
                    if (!run) break;
                    uint64_t keep = run == 8 ? ~0ULL : (1ULL << (8 * run)) - 1;
                    non_ascii |= x & keep & LANE_TOPS;
                    h = fold_block(h, (x | letters >> 2) & keep);
                    i += run;
                    if (run < 8) break;
                }
            }
            if (words == capacity || (non_ascii && num_runs == run_capacity)) {
                overflow = 1;
                break;
            }
            if (non_ascii) {
                runs[3 * num_runs] = start;
                runs[3 * num_runs + 1] = i;
                runs[3 * num_runs + 2] = words;
                num_runs++;
                hashes[words++] = 0;
            } else {
                hashes[words++] = finish_word(h, (uint64_t)(i - start));
            }
        }
        offsets[d + 1] = words;
    }
    Py_END_ALLOW_THREADS
    if (overflow || changed) return refuse(b, 5, changed ? CHANGED : "hashes or runs hold fewer items than the texts have runs");
    release(b, 5);
    return Py_BuildValue("nn", words, num_runs);
}

/* gather_runs(data: u8, runs: i64 (2R), out: u8 out): the bytes data[start:end] of each run
 * (start, end), ascending and disjoint, end to end. */
static PyObject *gather_runs(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *objs[3];
    Buf b[3];
    static const Arg ARGS[] = {{"data", 1, 0}, {"runs", 8, 0}, {"out", 1, 1}};
    if (!PyArg_ParseTuple(args, "OOO", &objs[0], &objs[1], &objs[2])) return NULL;
    if (take_all(objs, b, ARGS, 3)) return NULL;
    const uint8_t *data = b[0].view.buf;
    const int64_t *runs = b[1].view.buf;
    uint8_t *out = b[2].view.buf;
    Py_ssize_t num_runs = b[1].view.len / 16, total = 0;
    int bad = b[1].view.len % 16 != 0;
    for (Py_ssize_t r = 0; !bad && r < num_runs; r++) {
        bad = runs[2 * r] < (r ? runs[2 * r - 1] : 0) || runs[2 * r] > runs[2 * r + 1] || runs[2 * r + 1] > b[0].view.len;
        total += bad ? 0 : runs[2 * r + 1] - runs[2 * r];  /* each run within data: no overflow before the check below */
        bad = bad || total > b[2].view.len;
    }
    if (bad || total != b[2].view.len) {
        return refuse(b, 3, "runs must be ascending, disjoint (start, end) pairs within data, out as long as they are");
    }
    int changed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0, o = 0; r < num_runs; r++) {
        int64_t start = runs[2 * r], end = runs[2 * r + 1];
        if (start < (r ? runs[2 * r - 1] : 0) || start > end || end > b[0].view.len || end - start > total - o) {
            changed = 1;  /* checked above, but another thread may write them now */
            break;
        }
        memcpy(out + o, data + start, (size_t)(end - start));
        o += end - start;
    }
    Py_END_ALLOW_THREADS
    return finish(b, 3, changed);
}

/* splice_words(hashes: u64 (T), offsets: i64 (N+1), places: i64 (R), words: u64 (Q), word_offsets:
 * i64 (R+1), out: u64 out (T-R+Q), out_offsets: i64 out (N+1)): each place in `hashes` (ascending)
 * replaced by its run's words, words[word_offsets[r]:word_offsets[r+1]] (none or many), and the
 * texts' offsets moved to match. */
static PyObject *splice_words(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *objs[7];
    Buf b[7];
    static const Arg ARGS[] = {{"hashes", 8, 0}, {"offsets", 8, 0}, {"places", 8, 0}, {"words", 8, 0},
                               {"word_offsets", 8, 0}, {"out", 8, 1}, {"out_offsets", 8, 1}};
    if (!PyArg_ParseTuple(args, "OOOOOOO", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5], &objs[6])) return NULL;
    if (take_all(objs, b, ARGS, 7)) return NULL;
    const uint64_t *hashes = b[0].view.buf, *words = b[3].view.buf;
    const int64_t *offsets = b[1].view.buf, *places = b[2].view.buf, *word_offsets = b[4].view.buf;
    uint64_t *out = b[5].view.buf;
    int64_t *out_offsets = b[6].view.buf;
    Py_ssize_t num_hashes = b[0].view.len / 8, num_offsets = b[1].view.len / 8, num_places = b[2].view.len / 8;
    Py_ssize_t num_words = b[3].view.len / 8;
    int bad = num_offsets < 1 || b[6].view.len / 8 != num_offsets || offsets[0] != 0 || offsets[num_offsets - 1] != num_hashes ||
              b[4].view.len / 8 != num_places + 1 || word_offsets[0] != 0 || word_offsets[num_places] != num_words ||
              b[5].view.len / 8 != num_hashes - num_places + num_words;
    for (Py_ssize_t d = 0; !bad && d + 1 < num_offsets; d++) bad = offsets[d] > offsets[d + 1];
    for (Py_ssize_t r = 0; !bad && r < num_places; r++)
        bad = places[r] < (r ? places[r - 1] + 1 : 0) || places[r] >= num_hashes || word_offsets[r] > word_offsets[r + 1];
    if (bad) {
        return refuse(b, 7, "offsets must run from 0 to T ascending, places ascend within hashes, word_offsets R+1 from 0 to Q, "
                        "out T-R+Q long, out_offsets N+1");
    }
    Py_ssize_t num_out = b[5].view.len / 8;
    int changed = 0;
    Py_BEGIN_ALLOW_THREADS
    int64_t o = 0, next = 0, shift = 0;
    for (Py_ssize_t r = 0; r < num_places && !changed; r++) {
        /* Checked above, but another thread may write them now: each value is checked as it is used. */
        int64_t place = places[r], low = word_offsets[r], high = word_offsets[r + 1];
        if (place < next || place >= num_hashes || low < 0 || low > high || high > num_words || place - next > num_out - o ||
            high - low > num_out - o - (place - next)) {
            changed = 1;
            break;
        }
        memcpy(out + o, hashes + next, (size_t)(place - next) * 8);
        o += place - next;
        memcpy(out + o, words + low, (size_t)(high - low) * 8);
        o += high - low;
        next = place + 1;
    }
    if (!changed && num_hashes - next == num_out - o) memcpy(out + o, hashes + next, (size_t)(num_hashes - next) * 8);
    else changed = 1;
    for (Py_ssize_t d = 0, r = 0; d < num_offsets && !changed; d++) {
        for (; r < num_places && places[r] < offsets[d]; r++) shift += word_offsets[r + 1] - word_offsets[r] - 1;
        out_offsets[d] = offsets[d] + shift;
    }
    Py_END_ALLOW_THREADS
    return finish(b, 7, changed);
}

/* hash_word_bytes(data: u8, starts: i64 (T+1), hashes: u64 out (T)): the hash of each word
 * data[starts[i]:starts[i+1]], as `word_runs` hashes a lower-cased word. */
static PyObject *hash_word_bytes(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *objs[3];
    Buf b[3];
    static const Arg ARGS[] = {{"data", 1, 0}, {"starts", 8, 0}, {"hashes", 8, 1}};
    if (!PyArg_ParseTuple(args, "OOO", &objs[0], &objs[1], &objs[2])) return NULL;
    if (take_all(objs, b, ARGS, 3)) return NULL;
    const uint8_t *data = b[0].view.buf;
    const int64_t *starts = b[1].view.buf;
    uint64_t *hashes = b[2].view.buf;
    Py_ssize_t num = b[1].view.len / 8 - 1;
    int bad = num < 0 || b[2].view.len / 8 != num;
    for (Py_ssize_t i = 0; !bad && i < num; i++) bad = starts[i] < 0 || starts[i] > starts[i + 1];
    if (bad || (num >= 0 && starts[num] > b[0].view.len)) {
        return refuse(b, 3, "starts must be T+1 ascending positions within data, hashes T long");
    }
    int changed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < num; i++) {
        int64_t start = starts[i], end = starts[i + 1];
        if (start < 0 || start > end || end > b[0].view.len) {  /* checked above, but another thread may write them now */
            changed = 1;
            break;
        }
        hashes[i] = hash_bytes(data + start, end - start);
    }
    Py_END_ALLOW_THREADS
    return finish(b, 3, changed);
}

WIDE_CLONES
static int minhash_rows(const uint32_t *x, Py_ssize_t num_x, const int64_t *offsets, Py_ssize_t num_docs, const uint32_t *a,
                        const uint32_t *b, Py_ssize_t num_perm, uint32_t *out) {
    for (Py_ssize_t d = 0; d < num_docs; d++) {
        int64_t low = offsets[d], high = offsets[d + 1];
        if (low < 0 || low > high || high > num_x) return 1;  /* checked before, but another thread may write them now */
        uint32_t *row = out + d * num_perm;
        for (Py_ssize_t p = 0; p < num_perm; p++) row[p] = EMPTY_SLOT;
        for (int64_t s = low; s < high; s++) {
            uint32_t v = x[s];
            for (Py_ssize_t p = 0; p < num_perm; p++) {
                uint32_t h = a[p] * v + b[p];
                row[p] = h < row[p] ? h : row[p];
            }
        }
    }
    return 0;
}

/* minhash(x: u32 (S), offsets: i64 (N+1), a: u32 (P), b: u32 (P), out: u32 out (N*P)): row d is
 * min over document d's shingles x of (a*x + b) mod 2^32, EMPTY_SLOT where it has none. */
static PyObject *minhash(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *objs[5];
    Buf bufs[5];
    static const Arg ARGS[] = {{"x", 4, 0}, {"offsets", 8, 0}, {"a", 4, 0}, {"b", 4, 0}, {"out", 4, 1}};
    if (!PyArg_ParseTuple(args, "OOOOO", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4])) return NULL;
    if (take_all(objs, bufs, ARGS, 5)) return NULL;
    const int64_t *offsets = bufs[1].view.buf;
    Py_ssize_t num_docs = bufs[1].view.len / 8 - 1, num_perm = bufs[2].view.len / 4, num_x = bufs[0].view.len / 4;
    int bad = num_docs < 0 || bufs[3].view.len / 4 != num_perm || (num_docs > 0 && num_perm > PY_SSIZE_T_MAX / num_docs) ||
              bufs[4].view.len / 4 != num_docs * num_perm;
    for (Py_ssize_t d = 0; !bad && d < num_docs; d++) bad = offsets[d] < 0 || offsets[d] > offsets[d + 1];
    if (bad || (num_docs >= 0 && offsets[num_docs] > num_x)) {
        return refuse(bufs, 5, "offsets must be N+1 ascending positions within x, a and b P long, out N*P");
    }
    int changed;
    Py_BEGIN_ALLOW_THREADS
    changed = minhash_rows(bufs[0].view.buf, num_x, offsets, num_docs, bufs[2].view.buf, bufs[3].view.buf, num_perm,
                           bufs[4].view.buf);
    Py_END_ALLOW_THREADS
    return finish(bufs, 5, changed);
}

/* shingle_hashes(tokens: u64 (T), token_offsets: i64 (N+1), k, multipliers: u64 (M), offsets: i64 (N+1),
 * out: u64 out (S)): each document's word k-grams, hashed as text.ngram_hashes does (for n words:
 * n + n(n-1)/2 + sum_j w[j] * multipliers[j % M], then mix64); a document of 1 to k-1 words has one
 * shingle, all its words (n = its length). `offsets` is where each document's shingles go. */
static PyObject *shingle_hashes(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *objs[5];
    Py_ssize_t k;
    Buf b[5];
    static const Arg ARGS[] = {{"tokens", 8, 0}, {"token_offsets", 8, 0}, {"multipliers", 8, 0}, {"offsets", 8, 0}, {"out", 8, 1}};
    if (!PyArg_ParseTuple(args, "OOnOOO", &objs[0], &objs[1], &k, &objs[2], &objs[3], &objs[4])) return NULL;
    if (take_all(objs, b, ARGS, 5)) return NULL;
    const uint64_t *tokens = b[0].view.buf, *mult = b[2].view.buf;
    const int64_t *starts = b[1].view.buf, *offsets = b[3].view.buf;
    uint64_t *out = b[4].view.buf;
    Py_ssize_t num_docs = b[1].view.len / 8 - 1, num_mult = b[2].view.len / 8, num_tokens = b[0].view.len / 8, num_out = b[4].view.len / 8;
    int bad = k < 1 || num_mult < 1 || num_docs < 0 || b[3].view.len / 8 != num_docs + 1 ||
              (num_docs >= 0 && (starts[0] != 0 || starts[num_docs] != num_tokens || offsets[0] != 0));
    for (Py_ssize_t d = 0; !bad && d < num_docs; d++) {
        bad = starts[d] > starts[d + 1] || offsets[d] > offsets[d + 1];
        if (!bad) {
            int64_t length = starts[d + 1] - starts[d];
            bad = offsets[d + 1] - offsets[d] != (length >= k ? length - k + 1 : (length > 0));
        }
    }
    if (bad || (num_docs >= 0 && offsets[num_docs] != num_out)) {
        return refuse(b, 5, "token_offsets must run from 0 to T ascending, offsets hold each document's shingles, out S long");
    }
    int changed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t d = 0; d < num_docs; d++) {
        /* Checked above, but another thread may write them now: each value is checked as it is used. */
        int64_t first = starts[d], end = starts[d + 1], placed = offsets[d], placed_end = offsets[d + 1];
        if (first < 0 || first > end || end > num_tokens || placed < 0 || placed > placed_end || placed_end > num_out ||
            placed_end - placed != (end - first >= k ? end - first - k + 1 : (end > first))) {
            changed = 1;
            break;
        }
        int64_t length = end - first, n = length >= k ? k : length, count = placed_end - placed;
        uint64_t base = (uint64_t)n + (uint64_t)(n * (n - 1) / 2);
        for (int64_t s = 0; s < count; s++) {
            uint64_t acc = base;
            /* m is j % num_mult, kept without a division: one per word took 3/4 of this loop (0.060 -> 0.016 s, short corpus) */
            for (int64_t j = 0, m = 0; j < n; j++, m = m + 1 == num_mult ? 0 : m + 1) acc += tokens[first + s + j] * mult[m];
            out[placed + s] = mix64(acc);
        }
    }
    Py_END_ALLOW_THREADS
    return finish(b, 5, changed);
}

static int compare_u64(const void *x, const void *y) {
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return (a > b) - (a < b);
}

/* Short segments (most documents' shingles) by insertion sort, long ones by qsort. */
static void sort_u64(uint64_t *v, int64_t n) {
    if (n > 32) {
        qsort(v, (size_t)n, sizeof *v, compare_u64);
        return;
    }
    for (int64_t i = 1; i < n; i++) {
        uint64_t x = v[i];
        int64_t j = i - 1;
        for (; j >= 0 && v[j] > x; j--) v[j + 1] = v[j];
        v[j + 1] = x;
    }
}

/* sorted_sets(values: u64 in out (S), offsets: i64 (M+1), kept: i64 out (M+1)) -> unique values
 * Each segment values[offsets[i]:offsets[i+1]] sorted and its repeats dropped, in place: segment i
 * then holds values[kept[i]:kept[i+1]]. */
static PyObject *sorted_sets(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *objs[3];
    Buf b[3];
    static const Arg ARGS[] = {{"values", 8, 1}, {"offsets", 8, 0}, {"kept", 8, 1}};
    if (!PyArg_ParseTuple(args, "OOO", &objs[0], &objs[1], &objs[2])) return NULL;
    if (take_all(objs, b, ARGS, 3)) return NULL;
    uint64_t *values = b[0].view.buf;
    const int64_t *offsets = b[1].view.buf;
    int64_t *kept = b[2].view.buf;
    Py_ssize_t num = b[1].view.len / 8 - 1;
    int bad = num < 0 || b[2].view.len / 8 != num + 1 || (num >= 0 && (offsets[0] != 0 || offsets[num] > b[0].view.len / 8));
    for (Py_ssize_t i = 0; !bad && i < num; i++) bad = offsets[i] > offsets[i + 1];
    if (bad) {
        return refuse(b, 3, "offsets must be M+1 ascending positions within values from 0, kept M+1 long");
    }
    int64_t out = 0, reached = 0, num_values = b[0].view.len / 8;
    int changed = 0;
    Py_BEGIN_ALLOW_THREADS
    if (num >= 0) kept[0] = 0;
    for (Py_ssize_t i = 0; i < num; i++) {
        /* Checked above, but another thread may write them now. A segment from where the last one
         * ended keeps the values written back (at `out`, never past `reached`) behind the ones read. */
        int64_t low = offsets[i], high = offsets[i + 1];
        if (low < reached || low > high || high > num_values) {
            changed = 1;
            break;
        }
        int64_t n = high - low;
        reached = high;
        sort_u64(values + low, n);
        for (int64_t j = 0; j < n; j++)
            if (j == 0 || values[low + j] != values[low + j - 1]) values[out++] = values[low + j];
        kept[i + 1] = out;
    }
    Py_END_ALLOW_THREADS
    if (changed) return refuse(b, 3, CHANGED);
    release(b, 3);
    return PyLong_FromLongLong(out);
}

/* pair_jaccard(sets: u64 (S), offsets: i64 (M+1), a: i64 (K), b: i64 (K), out: f64 out (K)): the
 * Jaccard of the sorted, unique sets a[i] and b[i] (0 where both are empty). */
static PyObject *pair_jaccard(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *objs[5];
    Buf b[5];
    static const Arg ARGS[] = {{"sets", 8, 0}, {"offsets", 8, 0}, {"a", 8, 0}, {"b", 8, 0}, {"out", 8, 1}};
    if (!PyArg_ParseTuple(args, "OOOOO", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4])) return NULL;
    if (take_all(objs, b, ARGS, 5)) return NULL;
    const uint64_t *sets = b[0].view.buf;
    const int64_t *offsets = b[1].view.buf, *first = b[2].view.buf, *second = b[3].view.buf;
    double *out = b[4].view.buf;
    Py_ssize_t num_sets = b[1].view.len / 8 - 1, num_pairs = b[2].view.len / 8;
    int bad = num_sets < 0 || b[3].view.len / 8 != num_pairs || b[4].view.len / 8 != num_pairs ||
              (num_sets >= 0 && (offsets[0] < 0 || offsets[num_sets] > b[0].view.len / 8));
    for (Py_ssize_t i = 0; !bad && i < num_sets; i++) bad = offsets[i] > offsets[i + 1];
    for (Py_ssize_t i = 0; !bad && i < num_pairs; i++) bad = first[i] < 0 || first[i] >= num_sets || second[i] < 0 || second[i] >= num_sets;
    if (bad) {
        return refuse(b, 5, "offsets must be M+1 ascending positions within sets, a and b K sets each, out K long");
    }
    Py_ssize_t num_values = b[0].view.len / 8;
    int changed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < num_pairs; i++) {
        /* Checked above, but another thread may write them now: each value is checked as it is used. */
        int64_t u = first[i], v = second[i];
        if (u < 0 || u >= num_sets || v < 0 || v >= num_sets) {
            changed = 1;
            break;
        }
        int64_t x = offsets[u], x_end = offsets[u + 1], y = offsets[v], y_end = offsets[v + 1];
        if (x < 0 || x > x_end || x_end > num_values || y < 0 || y > y_end || y_end > num_values) {
            changed = 1;
            break;
        }
        int64_t both = 0, size = (x_end - x) + (y_end - y);
        while (x < x_end && y < y_end) {
            if (sets[x] < sets[y]) x++;
            else if (sets[x] > sets[y]) y++;
            else { both++; x++; y++; }
        }
        out[i] = size > both ? (double)both / (double)(size - both) : 0.0;
    }
    Py_END_ALLOW_THREADS
    return finish(b, 5, changed);
}

/* band_keys(signatures: u32 (N*P), bands, rows, multipliers: u64 (M), out: u64 out (N*bands)): the
 * hash of each band's `rows` slots, as near_dedup.band_keys states it: from the band's number,
 * acc = acc * 0x100000001B3 + slot[k] * multipliers[k % M], then mix64. */
static PyObject *band_keys(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *objs[3];
    Py_ssize_t bands, rows;
    Buf b[3];
    static const Arg ARGS[] = {{"signatures", 4, 0}, {"multipliers", 8, 0}, {"out", 8, 1}};
    if (!PyArg_ParseTuple(args, "OnnOO", &objs[0], &bands, &rows, &objs[1], &objs[2])) return NULL;
    if (take_all(objs, b, ARGS, 3)) return NULL;
    const uint32_t *sig = b[0].view.buf;
    const uint64_t *mult = b[1].view.buf;
    uint64_t *out = b[2].view.buf;
    if (bands < 1 || rows < 1 || rows > PY_SSIZE_T_MAX / bands) {
        return refuse(b, 3, "signatures must be N rows of bands*rows slots, out N*bands long");
    }
    Py_ssize_t width = bands * rows, num_mult = b[1].view.len / 8;
    Py_ssize_t num_docs = width > 0 ? b[0].view.len / 4 / width : 0;
    if (bands < 1 || rows < 1 || num_mult < 1 || b[0].view.len / 4 != num_docs * width || b[2].view.len / 8 != num_docs * bands) {
        return refuse(b, 3, "signatures must be N rows of bands*rows slots, out N*bands long");
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t d = 0; d < num_docs; d++) {
        const uint32_t *row = sig + d * width;
        for (Py_ssize_t j = 0; j < bands; j++) {
            uint64_t acc = (uint64_t)j;
            for (Py_ssize_t k = 0, m = 0; k < rows; k++, m = m + 1 == num_mult ? 0 : m + 1)  /* m: k % num_mult */
                acc = acc * 0x100000001B3ULL + (uint64_t)row[j * rows + k] * mult[m];
            out[d * bands + j] = mix64(acc);
        }
    }
    Py_END_ALLOW_THREADS
    return finish(b, 3, 0);
}

/* signature_agreement(signatures: u32 (N*P), P, a: i64 (K), b: i64 (K), out: f64 out (K)): the
 * share of equal slots of rows a[i] and b[i], the count over P (numpy's mean of the equalities). */
static PyObject *signature_agreement(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *objs[4];
    Py_ssize_t num_perm;
    Buf b[4];
    static const Arg ARGS[] = {{"signatures", 4, 0}, {"a", 8, 0}, {"b", 8, 0}, {"out", 8, 1}};
    if (!PyArg_ParseTuple(args, "OnOOO", &objs[0], &num_perm, &objs[1], &objs[2], &objs[3])) return NULL;
    if (take_all(objs, b, ARGS, 4)) return NULL;
    const uint32_t *sig = b[0].view.buf;
    const int64_t *first = b[1].view.buf, *second = b[2].view.buf;
    double *out = b[3].view.buf;
    Py_ssize_t num_pairs = b[1].view.len / 8, num_rows = num_perm > 0 ? b[0].view.len / 4 / num_perm : 0;
    int bad = num_perm < 1 || b[0].view.len / 4 != num_rows * num_perm || b[2].view.len / 8 != num_pairs || b[3].view.len / 8 != num_pairs;
    for (Py_ssize_t i = 0; !bad && i < num_pairs; i++) bad = first[i] < 0 || first[i] >= num_rows || second[i] < 0 || second[i] >= num_rows;
    if (bad) {
        return refuse(b, 4, "signatures must be N rows of P slots, a and b K rows each, out K long");
    }
    int changed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < num_pairs; i++) {
        int64_t u = first[i], v = second[i];
        if (u < 0 || u >= num_rows || v < 0 || v >= num_rows) {  /* checked above, but another thread may write them now */
            changed = 1;
            break;
        }
        const uint32_t *x = sig + u * num_perm, *y = sig + v * num_perm;
        Py_ssize_t equal = 0;
        for (Py_ssize_t p = 0; p < num_perm; p++) equal += x[p] == y[p];
        out[i] = (double)equal / (double)num_perm;
    }
    Py_END_ALLOW_THREADS
    return finish(b, 4, changed);
}

/* SHA-256 (FIPS 180-4), for the documents' ids: hashlib takes one message a call, ~1 us each in
 * Python; here a source's prefix is hashed once and each row finishes from its state.
 * The constants: the first 32 bits of the fractional parts of the square roots of the first 8
 * primes (H) and the cube roots of the first 64 (K). */
static const uint32_t SHA256_H[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
static const uint32_t SHA256_K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

#define ROTR32(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha256_block(uint32_t state[8], const uint8_t *block) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)block[4 * i] << 24 | (uint32_t)block[4 * i + 1] << 16 | (uint32_t)block[4 * i + 2] << 8 | block[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROTR32(w[i - 15], 7) ^ ROTR32(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROTR32(w[i - 2], 17) ^ ROTR32(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = state[0], b = state[1], c = state[2], d = state[3], e = state[4], f = state[5], g = state[6], h = state[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (ROTR32(e, 6) ^ ROTR32(e, 11) ^ ROTR32(e, 25)) + ((e & f) ^ (~e & g)) + SHA256_K[i] + w[i];
        uint32_t t2 = (ROTR32(a, 2) ^ ROTR32(a, 13) ^ ROTR32(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    state[0] += a;
    state[1] += b;
    state[2] += c;
    state[3] += d;
    state[4] += e;
    state[5] += f;
    state[6] += g;
    state[7] += h;
}

/* row_digests(prefix: u8 (L), rows: i64 (N), out: u8 out (32N)): the SHA-256 of `prefix` followed
 * by each row's decimal digits, as hashlib.sha256(prefix + b"%d" % row).digest(). */
static PyObject *row_digests(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *objs[3];
    Buf b[3];
    static const Arg ARGS[] = {{"prefix", 1, 0}, {"rows", 8, 0}, {"out", 1, 1}};
    if (!PyArg_ParseTuple(args, "OOO", &objs[0], &objs[1], &objs[2])) return NULL;
    if (take_all(objs, b, ARGS, 3)) return NULL;
    const uint8_t *prefix = b[0].view.buf;
    const int64_t *rows = b[1].view.buf;
    uint8_t *out = b[2].view.buf;
    Py_ssize_t length = b[0].view.len, num_rows = b[1].view.len / 8;
    if (num_rows > PY_SSIZE_T_MAX / 32 || b[2].view.len != 32 * num_rows || length > PY_SSIZE_T_MAX / 8 - 64) {
        return refuse(b, 3, "out must be 32 bytes a row");
    }
    Py_BEGIN_ALLOW_THREADS
    uint32_t prefix_state[8];
    memcpy(prefix_state, SHA256_H, sizeof prefix_state);
    Py_ssize_t whole = length / 64 * 64, tail = length - whole;
    for (Py_ssize_t i = 0; i < whole; i += 64) sha256_block(prefix_state, prefix + i);
    for (Py_ssize_t r = 0; r < num_rows; r++) {
        uint8_t message[128] = {0};  /* the prefix's last bytes (< 64), 1 to 20 digits, padding */
        char digits[20];
        int num_digits = 0;
        uint64_t value = rows[r] < 0 ? 0 - (uint64_t)rows[r] : (uint64_t)rows[r];
        do {
            digits[num_digits++] = (char)('0' + value % 10);
            value /= 10;
        } while (value);
        memcpy(message, prefix + whole, (size_t)tail);
        Py_ssize_t used = tail;
        if (rows[r] < 0) message[used++] = '-';
        while (num_digits) message[used++] = (uint8_t)digits[--num_digits];
        uint64_t bits = 8 * (uint64_t)(whole + used);
        Py_ssize_t blocks = used + 9 <= 64 ? 1 : 2;
        message[used] = 0x80;
        for (int k = 0; k < 8; k++) message[64 * blocks - 1 - k] = (uint8_t)(bits >> (8 * k));
        uint32_t state[8];
        memcpy(state, prefix_state, sizeof state);
        for (Py_ssize_t k = 0; k < blocks; k++) sha256_block(state, message + 64 * k);
        for (int k = 0; k < 32; k++) out[32 * r + k] = (uint8_t)(state[k / 4] >> (24 - 8 * (k % 4)));
    }
    Py_END_ALLOW_THREADS
    return finish(b, 3, 0);
}

static PyMethodDef methods[] = {
    {"band_keys", band_keys, METH_VARARGS, "The hash of each band of each signature."},
    {"sorted_sets", sorted_sets, METH_VARARGS, "Each segment sorted, its repeats dropped, in place."},
    {"pair_jaccard", pair_jaccard, METH_VARARGS, "The Jaccard of pairs of sorted sets."},
    {"shingle_hashes", shingle_hashes, METH_VARARGS, "Word k-gram hashes of each document."},
    {"word_runs", word_runs, METH_VARARGS, "Word hashes of texts laid end to end, non-ASCII runs left to the caller."},
    {"gather_runs", gather_runs, METH_VARARGS, "The bytes of each run, end to end."},
    {"splice_words", splice_words, METH_VARARGS, "Placeholders in word hashes replaced by their runs' words."},
    {"hash_word_bytes", hash_word_bytes, METH_VARARGS, "The hash of each word's bytes."},
    {"minhash", minhash, METH_VARARGS, "MinHash signatures of shingle lists."},
    {"signature_agreement", signature_agreement, METH_VARARGS, "The share of equal slots of pairs of signatures."},
    {"row_digests", row_digests, METH_VARARGS, "The SHA-256 of a prefix followed by each row's digits."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernels", NULL, -1, methods};

PyMODINIT_FUNC PyInit__kernels(void) {
    return PyModule_Create(&module);
}
