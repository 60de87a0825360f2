/* One chunk of a Kineto trace's events array -> columns, in one pass over the text.
 *
 * The fast path of tracestory.ingest.kineto (see kineto_native.py for the model, the columns and
 * what comes back). The contract that keeps it exact: this scanner is stricter than msgspec's typed
 * decode, never laxer. Whatever it does not handle exactly as that decode would (a value of an
 * unexpected type, an int field written as a float, a duplicate key, a string escape in a key, a
 * missing or unknown "ph", a grid that is not three ints, a number out of range, nesting deeper
 * than MAX_DEPTH, text that is not JSON) makes scan() return None, and the caller decodes the chunk
 * with msgspec as before. So a chunk is either read here completely, or not at all.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the scanner reads eight bytes at a time, little-endian (the build is optional: msgspec reads instead)"
#endif

#define MAX_DEPTH 64

/* int args, in the order of kineto_native.INT_ARGS */
enum {
    A_EXT, A_CORR, A_DEVICE, A_STREAM, A_BYTES, A_REGS, A_SHMEM, A_TOTAL_ALLOC, A_TOTAL_RES, A_DELTA,
    A_DEV_ID, A_DEV_TYPE, A_IN_NELEMS, A_OUT_NELEMS, A_GROUP_SIZE, A_SEQ, A_SEQ_LOWER, N_INT
};
static const int64_t INT_DEFAULT[N_INT] = {-1, -1, -1, -1, -1, -1, -1, -1, -1, 0, -1, -1, -1, -1, -1, -1, -1};
/* raw JSON args, in the order of kineto_native.RAW_ARGS; args.name and "Collective name" are
 * checked to be strings (their JSON text is kept with the quotes) */
enum { R_DIMS, R_DIMS_2021, R_TYPES, R_CONCRETE, R_ARGNAME, R_COLL_NAME, R_DTYPE, R_PG_NAME, R_PG_RANKS, N_RAW };

/* per-event flags */
#define FL_PID_STR 1  /* pid was a string: its first integer (or -1) is in pid */
#define FL_TID_STR 2

/* the rows that carry one raw arg, and its JSON text as bytes objects */
typedef struct {
    Py_ssize_t n, cap;
    int64_t *rows;
    PyObject **objs;
} RawList;

/* The columns live in bytearrays that Python reads without a copy (numpy views) and that the next
 * call writes again, so their pages are touched once per file, not once per chunk. A bytearray
 * still viewed when a call starts (an export) is left to its viewers and a fresh one is made. */
enum { C_PH, C_FLAGS, C_CAT, C_NAME, C_PID, C_TID, C_TS, C_DUR, C_FLOPS, C_INTS, C_GRID, C_BLOCK, N_COL };
static const Py_ssize_t COL_BYTES[N_COL] = {1, 1, 1, 4, 8, 8, 8, 8, 8, 8 * N_INT, 12, 12};

typedef struct {
    Py_ssize_t n, cap;
    PyObject *obj[N_COL];  /* bytearrays of cap rows */
    uint8_t *ph, *flags;
    int8_t *cat;
    int32_t *name;
    int64_t *pid, *tid;
    double *ts, *dur, *flops;
    int64_t *ints;  /* [cap][N_INT] */
    int32_t *grid, *block;  /* [cap][3] */
    RawList raw[N_RAW];
} Cols;

typedef struct {
    const char *s;  /* into the text */
    Py_ssize_t len;
    uint64_t hash;
    int escaped;
} Name;

typedef struct {
    Name *names;
    Py_ssize_t n, cap;
    int32_t *slots;  /* open addressing, -1 empty */
    Py_ssize_t mask;
} Names;

typedef struct {
    const char *p, *end, *base;
    const char **cats;
    Py_ssize_t *cat_len;
    int n_cats;
    const char *phases;  /* every accepted one-letter phase */
    const char *flows;   /* the flow phases: only "cat" is read */
    int depth;
} Scan;

/* ------------------------------------------------------------------ growing columns */
#define GROW(ptr, type, count) do { \
        type *q_ = (type *)realloc((ptr), sizeof(type) * (size_t)(count)); \
        if (!q_) return -1; \
        (ptr) = q_; \
    } while (0)

static void cols_free(Cols *c) {
    for (int k = 0; k < N_COL; k++) Py_CLEAR(c->obj[k]);
    for (int k = 0; k < N_RAW; k++) {
        for (Py_ssize_t i = 0; i < c->raw[k].n; i++) Py_DECREF(c->raw[k].objs[i]);
        free(c->raw[k].rows); free(c->raw[k].objs);
    }
    memset(c, 0, sizeof(*c));
}

/* the JSON text s[0:len] of row r's raw arg k; -1 out of memory */
static int raw_add(Cols *c, int k, Py_ssize_t r, const char *s, Py_ssize_t len) {
    RawList *l = &c->raw[k];
    if (l->n == l->cap) {
        Py_ssize_t cap = l->cap ? l->cap * 2 : 1024;
        GROW(l->rows, int64_t, cap);
        GROW(l->objs, PyObject *, cap);
        l->cap = cap;
    }
    PyObject *b = PyBytes_FromStringAndSize(s, len);
    if (!b) return -1;
    l->rows[l->n] = r;
    l->objs[l->n++] = b;
    return 0;
}

/* row r's raw args dropped (a flow whose keys came before its "ph") */
static void raw_drop(Cols *c, Py_ssize_t r) {
    for (int k = 0; k < N_RAW; k++) {
        RawList *l = &c->raw[k];
        while (l->n && l->rows[l->n - 1] == r) Py_DECREF(l->objs[--l->n]);
    }
}

static void cols_point(Cols *c) {
    char *b[N_COL];
    for (int k = 0; k < N_COL; k++) b[k] = c->obj[k] ? PyByteArray_AS_STRING(c->obj[k]) : NULL;
    c->ph = (uint8_t *)b[C_PH]; c->flags = (uint8_t *)b[C_FLAGS]; c->cat = (int8_t *)b[C_CAT];
    c->name = (int32_t *)b[C_NAME]; c->pid = (int64_t *)b[C_PID]; c->tid = (int64_t *)b[C_TID];
    c->ts = (double *)b[C_TS]; c->dur = (double *)b[C_DUR]; c->flops = (double *)b[C_FLOPS];
    c->ints = (int64_t *)b[C_INTS]; c->grid = (int32_t *)b[C_GRID]; c->block = (int32_t *)b[C_BLOCK];
}

/* at the start of a call: a bytearray still viewed from Python is given up (its viewers keep it) */
static void cols_start(Cols *c) {
    int viewed = 0;
    for (int k = 0; k < N_COL; k++)
        if (c->obj[k] && ((PyByteArrayObject *)c->obj[k])->ob_exports > 0) viewed = 1;
    if (viewed) {
        for (int k = 0; k < N_COL; k++) Py_CLEAR(c->obj[k]);
        c->cap = 0;
    }
    c->n = 0;
    cols_point(c);
}

static int cols_grow(Cols *c) {
    Py_ssize_t cap = c->cap ? c->cap * 2 : 4096;
    for (int k = 0; k < N_COL; k++) {
        if (!c->obj[k]) {
            c->obj[k] = PyByteArray_FromStringAndSize(NULL, cap * COL_BYTES[k]);
            if (!c->obj[k]) return -1;
        } else if (PyByteArray_Resize(c->obj[k], cap * COL_BYTES[k]) < 0) {
            return -1;
        }
    }
    c->cap = cap;
    cols_point(c);
    return 0;
}

/* ------------------------------------------------------------------ names (one table per chunk) */
static uint64_t hash_bytes(const char *s, Py_ssize_t len) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)len;
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 29;
        s += 8; len -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, (size_t)len);
    h = (h ^ w) * 0x94D049BB133111EBull;
    return h ^ (h >> 31);
}

static int names_init(Names *t) {
    t->cap = 1024; t->n = 0; t->mask = 4095;
    t->names = (Name *)malloc(sizeof(Name) * t->cap);
    t->slots = (int32_t *)malloc(sizeof(int32_t) * (t->mask + 1));
    if (!t->names || !t->slots) return -1;
    memset(t->slots, 0xff, sizeof(int32_t) * (t->mask + 1));
    return 0;
}

static void names_free(Names *t) { free(t->names); free(t->slots); t->names = NULL; t->slots = NULL; }

static int names_rehash(Names *t) {
    Py_ssize_t size = (t->mask + 1) * 2;
    int32_t *slots = (int32_t *)malloc(sizeof(int32_t) * size);
    if (!slots) return -1;
    memset(slots, 0xff, sizeof(int32_t) * size);
    for (Py_ssize_t i = 0; i < t->n; i++) {
        Py_ssize_t j = (Py_ssize_t)(t->names[i].hash & (uint64_t)(size - 1));
        while (slots[j] >= 0) j = (j + 1) & (size - 1);
        slots[j] = (int32_t)i;
    }
    free(t->slots);
    t->slots = slots;
    t->mask = size - 1;
    return 0;
}

/* the code of a name (its index in the table), -1 when out of memory */
static int32_t names_code(Names *t, const char *s, Py_ssize_t len, int escaped) {
    uint64_t h = hash_bytes(s, len);
    Py_ssize_t j = (Py_ssize_t)(h & (uint64_t)t->mask);
    for (;;) {
        int32_t k = t->slots[j];
        if (k < 0) break;
        Name *e = &t->names[k];
        if (e->hash == h && e->len == len && memcmp(e->s, s, (size_t)len) == 0) return k;
        j = (j + 1) & t->mask;
    }
    if (t->n == t->cap) {
        Name *q = (Name *)realloc(t->names, sizeof(Name) * t->cap * 2);
        if (!q) return -1;
        t->names = q; t->cap *= 2;
    }
    int32_t k = (int32_t)t->n++;
    t->names[k] = (Name){s, len, h, escaped};
    t->slots[j] = k;
    if (t->n * 2 > t->mask + 1 && names_rehash(t) < 0) return -1;
    return k;
}

/* ------------------------------------------------------------------ JSON pieces */
static inline void ws(Scan *S) {
    const char *p = S->p, *end = S->end;
    if (p < end && (unsigned char)*p > ' ') return;  /* compact JSON: no whitespace */
    while (end - p >= 8) {  /* indentation: eight spaces at a time */
        uint64_t w;
        memcpy(&w, p, 8);
        if (w != 0x2020202020202020ull) break;
        p += 8;
    }
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    S->p = p;
}

static inline int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One UTF-8 sequence at p (first byte >= 0x80): its length, 0 if invalid (overlong, a surrogate,
 * beyond U+10FFFF, cut short). */
static inline int utf8_len(const unsigned char *p, const unsigned char *end) {
    unsigned c = p[0];
    if (c >= 0xC2 && c <= 0xDF) return (end - p >= 2 && (p[1] & 0xC0) == 0x80) ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (end - p < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && p[1] < 0xA0) return 0;
        if (c == 0xED && p[1] >= 0xA0) return 0;
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (end - p < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return 0;
        if (c == 0xF0 && p[1] < 0x90) return 0;
        if (c == 0xF4 && p[1] >= 0x90) return 0;
        return 4;
    }
    return 0;
}

#define ONES 0x0101010101010101ull
#define HIGHS 0x8080808080808080ull
static inline uint64_t has_zero(uint64_t v) { return (v - ONES) & ~v & HIGHS; }

/* A string at S->p (the opening quote): sets *s and *len to its raw text (between the quotes) and
 * *escaped; returns 0, or -1 when it is not a valid JSON string (or holds a \u escape of a
 * surrogate, which this scanner leaves to msgspec). */
static inline __attribute__((always_inline)) int string(Scan *S, const char **s, Py_ssize_t *len, int *escaped) {
    const char *p = S->p + 1, *end = S->end;
    int esc = 0;
    for (;;) {
        while (end - p >= 8) {  /* eight plain ASCII bytes at a time */
            uint64_t w;
            memcpy(&w, p, 8);
            uint64_t special = (w & HIGHS) | has_zero(w ^ (ONES * '"')) | has_zero(w ^ (ONES * '\\'))
                               | ((w - ONES * 0x20) & ~w & HIGHS);
            if (special) {  /* the lowest flagged byte is exact (little-endian): go straight to it */
                p += __builtin_ctzll(special) >> 3;
                break;
            }
            p += 8;
        }
        if (p >= end) return -1;
        unsigned char c = (unsigned char)*p;
        if (c == '"') break;
        if (c < 0x20) return -1;
        if (c == '\\') {
            esc = 1;
            if (end - p < 2) return -1;
            char e = p[1];
            if (e == 'u') {
                if (end - p < 6) return -1;
                int v = 0;
                for (int i = 2; i < 6; i++) {
                    int h = hexval(p[i]);
                    if (h < 0) return -1;
                    v = v * 16 + h;
                }
                if (v >= 0xD800 && v <= 0xDFFF) return -1;
                p += 6;
            } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't') {
                p += 2;
            } else {
                return -1;
            }
        } else if (c >= 0x80) {
            int n = utf8_len((const unsigned char *)p, (const unsigned char *)end);
            if (!n) return -1;
            p += n;
        } else {
            p++;
        }
    }
    *s = S->p + 1;
    *len = p - (S->p + 1);
    *escaped = esc;
    S->p = p + 1;
    return 0;
}

static int skip_value(Scan *S);

/* A number's text at S->p: sets *is_int (no fraction, no exponent); returns 0 or -1. */
static int number_span(Scan *S, const char **start, int *is_int) {
    const char *p = S->p, *end = S->end;
    *start = p;
    *is_int = 1;
    if (p < end && *p == '-') p++;
    if (p >= end) return -1;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') { while (p < end && *p >= '0' && *p <= '9') p++; }
    else return -1;
    if (p < end && *p == '.') {
        *is_int = 0;
        p++;
        if (p >= end || *p < '0' || *p > '9') return -1;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        *is_int = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || *p < '0' || *p > '9') return -1;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    S->p = p;
    return 0;
}

static const double P10[23] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14,
                               1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* A JSON number as a double, rounded correctly: exactly (one IEEE operation on exact operands)
 * when the digits fit 2**53 and the power of ten is exact, else by CPython's own correctly
 * rounded parser. -1 when it is not a number or not finite (msgspec: "Number out of range"). */
static int number_double_slow(Scan *S, double *out);

static int number_double(Scan *S, double *out) {
    /* the usual case in one pass: -?(0|[1-9][0-9]*)(.[0-9]+)? with at most 19 digits */
    const char *p = S->p, *end = S->end;
    int neg = 0;
    if (p < end && *p == '-') { neg = 1; p++; }
    uint64_t m = 0;
    int digits = 0, frac = 0;
    if (p < end && *p == '0') {
        p++;
    } else if (p < end && *p >= '1' && *p <= '9') {
        for (; p < end && (unsigned)(*p - '0') < 10; p++, digits++) m = m * 10 + (uint64_t)(*p - '0');
    } else {
        return -1;
    }
    if (p < end && *p == '.') {
        const char *f = ++p;
        for (; p < end && (unsigned)(*p - '0') < 10; p++) m = m * 10 + (uint64_t)(*p - '0');
        frac = (int)(p - f);
        if (!frac) return -1;
        digits += frac;
    }
    if (digits > 19 || (p < end && (*p == 'e' || *p == 'E')) || m > (1ull << 53) || frac > 22)
        return number_double_slow(S, out);  /* m may have wrapped: read again from the start */
    double v = frac ? (double)m / P10[frac] : (double)m;
    *out = neg && (m || frac) ? -v : v;  /* msgspec reads the integer literal -0 as the int 0: +0.0 */
    S->p = p;
    return 0;
}

static int number_double_slow(Scan *S, double *out) {
    const char *start;
    int is_int;
    if (number_span(S, &start, &is_int) < 0) return -1;
    char buf[128];
    Py_ssize_t n = S->p - start;
    if (n >= (Py_ssize_t)sizeof(buf)) return -1;
    memcpy(buf, start, (size_t)n);
    buf[n] = 0;
    char *stop = NULL;
    double v = PyOS_string_to_double(buf, &stop, NULL);
    if (v == -1.0 && PyErr_Occurred()) { PyErr_Clear(); return -1; }
    if (stop != buf + n || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

/* A JSON integer literal within int64 (msgspec's int field refuses a float literal; an id beyond
 * int64 refuses the file later: both are left to the msgspec path). */
static int number_int(Scan *S, int64_t *out) {
    const char *p = S->p, *end = S->end;
    int neg = 0;
    if (p < end && *p == '-') { neg = 1; p++; }
    const char *d = p;
    if (p < end && *p == '0') p++;
    else if (p < end && *p >= '1' && *p <= '9') { while (p < end && (unsigned)(*p - '0') < 10) p++; }
    else return -1;
    if (p < end && (*p == '.' || *p == 'e' || *p == 'E')) return -1;  /* a float literal */
    if (p - d > 18) return -1;  /* at most 18 digits: no overflow check needed */
    int64_t v = 0;
    for (; d < p; d++) v = v * 10 + (*d - '0');
    *out = neg ? -v : v;
    S->p = p;
    return 0;
}

static int skip_container(Scan *S, char close) {
    if (++S->depth > MAX_DEPTH) return -1;
    S->p++;
    ws(S);
    if (S->p < S->end && *S->p == close) { S->p++; S->depth--; return 0; }
    for (;;) {
        if (close == '}') {
            const char *s; Py_ssize_t len; int esc;
            if (S->p >= S->end || *S->p != '"' || string(S, &s, &len, &esc) < 0) return -1;
            ws(S);
            if (S->p >= S->end || *S->p != ':') return -1;
            S->p++;
            ws(S);
        }
        if (skip_value(S) < 0) return -1;
        ws(S);
        if (S->p >= S->end) return -1;
        if (*S->p == ',') { S->p++; ws(S); continue; }
        if (*S->p == close) { S->p++; S->depth--; return 0; }
        return -1;
    }
}

static int literal(Scan *S, const char *word, Py_ssize_t n) {
    if (S->end - S->p < n || memcmp(S->p, word, (size_t)n) != 0) return -1;
    S->p += n;
    return 0;
}

static int skip_value(Scan *S) {
    if (S->p >= S->end) return -1;
    switch (*S->p) {
        case '"': { const char *s; Py_ssize_t len; int esc; return string(S, &s, &len, &esc); }
        case '{': return skip_container(S, '}');
        case '[': return skip_container(S, ']');
        case 't': return literal(S, "true", 4);
        case 'f': return literal(S, "false", 5);
        case 'n': return literal(S, "null", 4);
        default: { const char *s; int is_int; return number_span(S, &s, &is_int); }
    }
}

static inline int is_null(Scan *S) {
    if (S->end - S->p >= 4 && memcmp(S->p, "null", 4) == 0) { S->p += 4; return 1; }
    return 0;
}

/* grid / block: null (absent: -1s) or a list of exactly three ints within int32 */
static int dims3(Scan *S, int32_t *out) {
    if (is_null(S)) return 0;
    if (*S->p != '[') return -1;
    S->p++;
    for (int i = 0; i < 3; i++) {
        ws(S);
        int64_t v;
        if (number_int(S, &v) < 0 || v < INT32_MIN || v > INT32_MAX) return -1;
        out[i] = (int32_t)v;
        ws(S);
        if (S->p >= S->end) return -1;
        if (i < 2) { if (*S->p != ',') return -1; S->p++; }
    }
    if (*S->p != ']') return -1;
    S->p++;
    return 0;
}

/* pid / tid: an int within int64, or a string read as its first integer (-1 without one), as
 * kineto._to_int does; strings with escapes or non-ASCII bytes go to the msgspec path. */
static int id_value(Scan *S, int64_t *out, uint8_t *flags, uint8_t flag) {
    if (*S->p != '"') return number_int(S, out);
    const char *s; Py_ssize_t len; int esc;
    if (string(S, &s, &len, &esc) < 0 || esc) return -1;
    *flags |= flag;
    Py_ssize_t i = 0;
    for (; i < len; i++) {
        if ((unsigned char)s[i] >= 0x80) return -1;
    }
    for (i = 0; i < len && !(s[i] >= '0' && s[i] <= '9'); i++) {}
    if (i == len) { *out = -1; return 0; }
    int neg = i > 0 && s[i - 1] == '-';
    int64_t v = 0;
    Py_ssize_t j = i;
    for (; j < len && s[j] >= '0' && s[j] <= '9'; j++) {
        if (j - i >= 18) return -1;
        v = v * 10 + (s[j] - '0');
    }
    *out = neg ? -v : v;
    return 0;
}

/* An object member's key (no escapes: a key with one is left to msgspec) and the ":" after it;
 * S->p is left on the value. */
static inline __attribute__((always_inline)) int member_key(Scan *S, const char **k, Py_ssize_t *len) {
    int esc;
    if (S->p >= S->end || *S->p != '"' || string(S, k, len, &esc) < 0 || esc) return -1;
    ws(S);
    if (S->p >= S->end || *S->p != ':') return -1;
    S->p++;
    ws(S);
    return S->p < S->end ? 0 : -1;
}

#define KEY(lit) (len == (Py_ssize_t)sizeof(lit) - 1 && memcmp(k, lit, sizeof(lit) - 1) == 0)

/* the args object of row r */
static int args(Scan *S, Cols *c, Py_ssize_t r) {
    if (is_null(S)) return 0;
    if (*S->p != '{') return -1;
    if (++S->depth > MAX_DEPTH) return -1;
    S->p++;
    ws(S);
    if (S->p < S->end && *S->p == '}') { S->p++; S->depth--; return 0; }
    uint32_t seen = 0;
    for (;;) {
        const char *k;
        Py_ssize_t len;
        if (member_key(S, &k, &len) < 0) return -1;
        int field = -1, raw = -1, dims = 0;
        switch (len) {
            case 3: if (KEY("Seq")) field = A_SEQ; else if (KEY("seq")) field = A_SEQ_LOWER; break;
            case 4: if (KEY("grid")) dims = 1; else if (KEY("name")) raw = R_ARGNAME; break;
            case 5:
                if (KEY("bytes")) field = A_BYTES;
                else if (KEY("block")) dims = 2;
                else if (KEY("flops")) dims = 3;
                else if (KEY("Bytes")) field = A_DELTA;
                else if (KEY("dtype")) raw = R_DTYPE;
                break;
            case 6: if (KEY("device")) field = A_DEVICE; else if (KEY("stream")) field = A_STREAM; break;
            case 9: if (KEY("Device Id")) field = A_DEV_ID; break;
            case 10:
                if (KEY("Input Dims")) raw = R_DIMS;
                else if (KEY("Input dims")) raw = R_DIMS_2021;
                else if (KEY("Input type")) raw = R_TYPES;
                else if (KEY("Group size")) field = A_GROUP_SIZE;
                break;
            case 11:
                if (KEY("External id")) field = A_EXT;
                else if (KEY("correlation")) field = A_CORR;
                else if (KEY("Device Type")) field = A_DEV_TYPE;
                break;
            case 13: if (KEY("shared memory")) field = A_SHMEM; else if (KEY("In msg nelems")) field = A_IN_NELEMS; break;
            case 14:
                if (KEY("Total Reserved")) field = A_TOTAL_RES;
                else if (KEY("Out msg nelems")) field = A_OUT_NELEMS;
                break;
            case 15:
                if (KEY("Total Allocated")) field = A_TOTAL_ALLOC;
                else if (KEY("Concrete Inputs")) raw = R_CONCRETE;
                else if (KEY("Collective name")) raw = R_COLL_NAME;
                break;
            case 18: if (KEY("Process Group Name")) raw = R_PG_NAME; break;
            case 19: if (KEY("Process Group Ranks")) raw = R_PG_RANKS; break;
            case 20: if (KEY("registers per thread")) field = A_REGS; break;
        }
        int bit = field >= 0 ? field : raw >= 0 ? N_INT + raw : dims ? N_INT + N_RAW + dims - 1 : -1;
        if (bit >= 0) {
            if (seen & (1u << bit)) return -1;  /* a duplicate key: left to msgspec */
            seen |= 1u << bit;
        }
        if (field >= 0) {
            if (number_int(S, &c->ints[r * N_INT + field]) < 0) return -1;
        } else if (raw >= 0) {
            const char *s = S->p;
            if ((raw == R_ARGNAME || raw == R_COLL_NAME) && *S->p != '"') return -1;
            if (skip_value(S) < 0) return -1;
            if (raw_add(c, raw, r, s, S->p - s) < 0) return -2;
        } else if (dims == 1 || dims == 2) {
            if (dims3(S, (dims == 1 ? c->grid : c->block) + r * 3) < 0) return -1;
        } else if (dims == 3) {
            if (number_double(S, &c->flops[r]) < 0) return -1;
        } else if (skip_value(S) < 0) {
            return -1;
        }
        ws(S);
        if (S->p >= S->end) return -1;
        if (*S->p == ',') { S->p++; ws(S); continue; }
        if (*S->p == '}') { S->p++; S->depth--; return 0; }
        return -1;
    }
}

/* one event object at S->p into row r: 0, or 1 for a flow of an unknown category (not kept, counted
 * in *flows: the row is free for the next event), -1 for the msgspec path, -2 out of memory */
static int event(Scan *S, Cols *c, Names *names, Py_ssize_t r, int64_t *flows) {
    c->ph[r] = 0; c->flags[r] = 0; c->cat[r] = -1; c->name[r] = -1; c->pid[r] = -1; c->tid[r] = -1;
    c->ts[r] = NAN; c->dur[r] = NAN; c->flops[r] = NAN;
    memcpy(c->ints + r * N_INT, INT_DEFAULT, sizeof(INT_DEFAULT));
    for (int k = 0; k < 3; k++) { c->grid[r * 3 + k] = -1; c->block[r * 3 + k] = -1; }
    const char *cat = "", *name = "";
    Py_ssize_t cat_len = 0, name_len = 0;
    int name_esc = 0, flow = 0;
    uint32_t seen = 0;
    if (S->p >= S->end || *S->p != '{') return -1;
    S->p++;
    ws(S);
    if (S->p < S->end && *S->p == '}') return -1;  /* no ph */
    for (;;) {
        const char *k;
        Py_ssize_t len;
        if (member_key(S, &k, &len) < 0) return -1;
        int bit = -1;
        if (KEY("ph")) bit = 0;
        else if (KEY("cat")) bit = 1;
        else if (KEY("name")) bit = 2;
        else if (KEY("pid")) bit = 3;
        else if (KEY("tid")) bit = 4;
        else if (KEY("ts")) bit = 5;
        else if (KEY("dur")) bit = 6;
        else if (KEY("args")) bit = 7;
        if (bit >= 0) {
            if (seen & (1u << bit)) return -1;
            seen |= 1u << bit;
        }
        if (bit == 0) {
            const char *s; Py_ssize_t n; int e;
            if (*S->p != '"' || string(S, &s, &n, &e) < 0 || e || n != 1 || !s[0] || !strchr(S->phases, s[0]))
                return -1;
            c->ph[r] = (uint8_t)s[0];
            flow = strchr(S->flows, s[0]) != NULL;
        } else if (bit == 1) {
            int e;
            if (*S->p != '"' || string(S, &cat, &cat_len, &e) < 0 || e) return -1;
        } else if (flow && bit >= 2) {  /* a flow keeps its cat alone */
            if (skip_value(S) < 0) return -1;
        } else if (bit == 2) {
            if (*S->p != '"' || string(S, &name, &name_len, &name_esc) < 0) return -1;
        } else if (bit == 3 || bit == 4) {
            if (id_value(S, bit == 3 ? &c->pid[r] : &c->tid[r], &c->flags[r], bit == 3 ? FL_PID_STR : FL_TID_STR) < 0)
                return -1;
        } else if (bit == 5 || bit == 6) {
            if (number_double(S, bit == 5 ? &c->ts[r] : &c->dur[r]) < 0) return -1;
        } else if (bit == 7) {
            int rc = args(S, c, r);
            if (rc < 0) return rc;
        } else if (skip_value(S) < 0) {
            return -1;
        }
        ws(S);
        if (S->p >= S->end) return -1;
        if (*S->p == ',') { S->p++; ws(S); continue; }
        if (*S->p == '}') { S->p++; break; }
        return -1;
    }
    if (!c->ph[r]) return -1;
    for (int i = 0; i < S->n_cats; i++) {
        if (S->cat_len[i] == cat_len && memcmp(S->cats[i], cat, (size_t)cat_len) == 0) { c->cat[r] = (int8_t)i; break; }
    }
    if (flow) {
        raw_drop(c, r);  /* args read before a late "ph": a flow keeps none */
        if (c->cat[r] < 0) {  /* the usual flow ("ac2g", "fwdbwd"): counted, not kept */
            (*flows)++;
            return 1;
        }
        /* a flow of a known category is kept as a row (the reader counts it as "without ph 'X'"),
         * with the defaults of a flow: nothing but its cat */
        c->flags[r] = 0; c->pid[r] = -1; c->tid[r] = -1; c->ts[r] = NAN; c->dur[r] = NAN; c->flops[r] = NAN;
        memcpy(c->ints + r * N_INT, INT_DEFAULT, sizeof(INT_DEFAULT));
        for (int k = 0; k < 3; k++) { c->grid[r * 3 + k] = -1; c->block[r * 3 + k] = -1; }
        name = ""; name_len = 0; name_esc = 0;
    }
    int32_t code = names_code(names, name, name_len, name_esc);
    if (code < 0) return -2;
    c->name[r] = code;
    return 0;
}

/* ------------------------------------------------------------------ the module function */
static Cols kept;         /* buffers kept between the calls of one file's read */
static Names kept_names;

static PyObject *release(PyObject *self, PyObject *unused) {
    cols_free(&kept);
    names_free(&kept_names);
    memset(&kept_names, 0, sizeof(kept_names));
    Py_RETURN_NONE;
}

static PyObject *bytes_of(const void *p, Py_ssize_t n) { return PyBytes_FromStringAndSize((const char *)p, n); }

/* column k for Python: its bytearray (the first n rows are the chunk's; read them without a copy) */
static PyObject *col_of(Cols *c, int k) {
    if (!c->obj[k]) return PyByteArray_FromStringAndSize(NULL, 0);
    Py_INCREF(c->obj[k]);
    return c->obj[k];
}

static PyObject *scan(PyObject *self, PyObject *args_) {
    Py_buffer view;
    PyObject *cats;
    const char *phases, *flows;
    if (!PyArg_ParseTuple(args_, "y*O!ss", &view, &PyTuple_Type, &cats, &phases, &flows)) return NULL;
    Scan S = {0};
    S.base = (const char *)view.buf;
    S.p = S.base;
    S.end = S.base + view.len;
    S.phases = phases;
    S.flows = flows;
    S.n_cats = (int)PyTuple_GET_SIZE(cats);
    if (S.n_cats > 127) { PyBuffer_Release(&view); PyErr_SetString(PyExc_ValueError, "too many categories"); return NULL; }
    const char *cat_s[128];
    Py_ssize_t cat_l[128];
    for (int i = 0; i < S.n_cats; i++) {
        PyObject *b = PyTuple_GET_ITEM(cats, i);
        if (!PyBytes_Check(b)) { PyBuffer_Release(&view); PyErr_SetString(PyExc_TypeError, "categories must be bytes"); return NULL; }
        cat_s[i] = PyBytes_AS_STRING(b);
        cat_l[i] = PyBytes_GET_SIZE(b);
    }
    S.cats = cat_s;
    S.cat_len = cat_l;

    Cols c = kept;  /* the buffers of the last call, reused (release() frees them) */
    cols_start(&c);
    Names names = kept_names;
    int64_t skipped_flows = 0;  /* flows of unknown categories, not kept */
    PyObject *result = NULL;
    int bad = 0, oom = 0;
    if (!names.slots && names_init(&names) < 0) { oom = 1; goto done; }
    names.n = 0;
    memset(names.slots, 0xff, sizeof(int32_t) * (names.mask + 1));
    ws(&S);
    if (S.p >= S.end || *S.p != '[') { bad = 1; goto done; }
    S.p++;
    ws(&S);
    if (S.p < S.end && *S.p == ']') { S.p++; goto tail; }
    for (;;) {
        if (c.n == c.cap && cols_grow(&c) < 0) { if (!PyErr_Occurred()) PyErr_NoMemory(); oom = 1; goto done; }
        int rc = event(&S, &c, &names, c.n, &skipped_flows);
        if (rc == -2) { if (!PyErr_Occurred()) PyErr_NoMemory(); oom = 1; goto done; }
        if (rc < 0) { bad = 1; goto done; }
        if (rc == 0) c.n++;
        ws(&S);
        if (S.p >= S.end) { bad = 1; goto done; }
        if (*S.p == ',') { S.p++; ws(&S); continue; }
        if (*S.p == ']') { S.p++; break; }
        bad = 1;
        goto done;
    }
tail:
    ws(&S);
    if (S.p != S.end) { bad = 1; goto done; }
    {
        Py_ssize_t n = c.n;
        PyObject *name_list = PyList_New(names.n);
        PyObject *escaped = PyBytes_FromStringAndSize(NULL, names.n);
        if (!name_list || !escaped) { Py_XDECREF(name_list); Py_XDECREF(escaped); goto done; }
        for (Py_ssize_t i = 0; i < names.n; i++) {
            PyObject *b = bytes_of(names.names[i].s, names.names[i].len);
            if (!b) { Py_DECREF(name_list); Py_DECREF(escaped); goto done; }
            PyList_SET_ITEM(name_list, i, b);
            PyBytes_AS_STRING(escaped)[i] = (char)names.names[i].escaped;
        }
        PyObject *raws = PyTuple_New(N_RAW);
        if (!raws) { Py_DECREF(name_list); Py_DECREF(escaped); goto done; }
        for (int k = 0; k < N_RAW; k++) {
            RawList *l = &c.raw[k];
            PyObject *objs = PyList_New(l->n);
            PyObject *rows = objs ? bytes_of(l->rows, l->n * 8) : NULL;
            if (!objs || !rows) {
                Py_XDECREF(objs); Py_XDECREF(rows); Py_DECREF(raws); Py_DECREF(name_list); Py_DECREF(escaped);
                goto done;
            }
            for (Py_ssize_t i = 0; i < l->n; i++) PyList_SET_ITEM(objs, i, l->objs[i]);  /* the list owns them */
            l->n = 0;
            PyTuple_SET_ITEM(raws, k, Py_BuildValue("NN", rows, objs));
        }
        result = Py_BuildValue(
            "nLNNNNNNNNNNNNNNN", n, (long long)skipped_flows,
            col_of(&c, C_PH), col_of(&c, C_CAT), col_of(&c, C_NAME), col_of(&c, C_FLAGS), col_of(&c, C_PID),
            col_of(&c, C_TID), col_of(&c, C_TS), col_of(&c, C_DUR), col_of(&c, C_FLOPS), col_of(&c, C_INTS),
            col_of(&c, C_GRID), col_of(&c, C_BLOCK), raws, name_list, escaped);
    }
done:
    for (int k = 0; k < N_RAW; k++) {  /* what was not handed over (a failed scan) */
        for (Py_ssize_t i = 0; i < c.raw[k].n; i++) Py_DECREF(c.raw[k].objs[i]);
        c.raw[k].n = 0;
    }
    kept = c;
    kept_names = names;
    PyBuffer_Release(&view);
    if (oom || PyErr_Occurred()) { if (!PyErr_Occurred()) PyErr_NoMemory(); Py_XDECREF(result); return NULL; }
    if (bad) Py_RETURN_NONE;
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(text, cats, phases, flows) -> columns of one chunk of Kineto events, or None (see kineto_native)"},
    {"release", release, METH_NOARGS, "release() frees the buffers kept between scan() calls"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_kineto_scan", .m_doc = NULL, .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__kineto_scan(void) { return PyModule_Create(&module); }
