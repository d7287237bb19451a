/* drainpipe.native._otlpjson: a block of OTLP JSON lines (one ExportTraceServiceRequest per line, as the
 * OpenTelemetry Collector's file exporter writes them) -> the span columns the OTLP mapping reads, in one pass.
 *
 * Why C: the reference decoder (inputs/otlp.py: json.loads, hex ids to base64, protobuf's json_format.ParseDict,
 * then the wire form read by ptars) builds a Python object per JSON value and a protobuf object per field: about
 * 38 us per span, some 26k spans/s, where JSON Lines events go through at millions per second. One pass over the
 * bytes fills the same columns ptars fills from the wire form (inputs/span_columns.py, SpanColumns), and the one
 * mapping (the C pass of _spanmap.c) runs on them unchanged: ~750 MB/s, ~0.55 us per span of the formats
 * benchmark's exports (420 bytes a span). Where that goes: strings (scanned 16 bytes at a time with SSE2 to the
 * first quote, backslash, control or non-ASCII byte), ids, integers, key matching; the output buffers are kept
 * from one block to the next (growing fresh ones cost a page fault per 4 KB, a sixth of the time).
 *
 * It is a fast path, never the judge. The reference decides whether a line is a valid export; this pass accepts
 * only lines whose meaning under the reference is beyond doubt and declines the others, line by line, and the
 * caller decodes a declined line with the reference (which then accepts it, or rejects it with its reason). A line
 * is accepted only when all of these hold:
 *   - it is one JSON object (after JSON whitespace), and nothing but JSON whitespace follows it;
 *   - every key is a field of its message under its JSON name (lowerCamelCase), at most once per object: an
 *     unknown key, a snake_case name (ParseDict reads both spellings, and refuses both at once) or a duplicate
 *     (json.loads keeps the last) declines. Fields the mapping does not read are still checked, as ParseDict
 *     checks them (a count must be an unsigned integer, a name a string, an event an object of event fields);
 *   - strings are valid UTF-8 without control characters; escapes are decoded (a lone surrogate declines);
 *   - integers are JSON integers (no fraction or exponent) or quoted ASCII digits (an optional '-' where the field
 *     is signed), within the field's range; enums (kind, status code) are such integers or the names of their
 *     values (SPAN_KIND_SERVER; the names are checked against opentelemetry-proto's by a test); a double is a JSON
 *     number that is finite as a double; bools are true/false; null is an unset field, as in ParseDict, but never
 *     a list element; bytesValue and entityRefs decline;
 *   - ids (traceId, spanId, parentSpanId of spans and links) are strings (any other value declines: the reference
 *     makes it an empty id): hex of even length decodes, any other string without whitespace is an empty id (the
 *     reference makes it one), and whitespace declines (bytes.fromhex skips some of it). A span's traceId of 36
 *     characters that is not hex declines too: the reference reads a UUID's 32 digits (inputs/trace_ids.py); the
 *     mapping decides which decoded trace ids it can use (16 bytes, or 8 left-padded).
 * Nesting deeper than MAX_DEPTH (array and kvlist values) declines.
 *
 * What it returns per accepted line: its resources (attributes into the resource pool; an absent resource has
 * none) and its spans in export order (line, resource, kind, start, end, status code, trace and span ids, name,
 * trace state, attributes into the span pool). A span without a status has code 0 (UNSET), which is how the mapping reads an
 * absent status. Attribute values: whether a pair has a value, its string value, its integer value; other value
 * types count as a value that is neither (the projection ptars reads, span_columns.py).
 */
#include "_numbers.h"
#include "_spanevents.h"
#include <stdlib.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#define MAX_DEPTH 32

/* A field or enum name and its length. */
typedef struct {
    const char *name;
    size_t len;
} Name;
#define N(lit) {lit, sizeof(lit) - 1}


typedef struct {
    const unsigned char *p, *end; /* the line being read */
    Cols c;
    int32_t line;
    int depth;
} Scan;


static inline void
ws(Scan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\r' || *s->p == '\n'))
        s->p++;
}

/* The next non-whitespace byte is c: consume it (1 if so, else 0 and nothing consumed). */
static inline int
eat(Scan *s, unsigned char c)
{
    ws(s);
    if (s->p < s->end && *s->p == c) {
        s->p++;
        return 1;
    }
    return 0;
}

static inline int
literal(Scan *s, const char *lit, size_t n)
{
    if ((size_t)(s->end - s->p) >= n && !memcmp(s->p, lit, n)) {
        s->p += n;
        return 1;
    }
    return 0;
}

/* `null` next (consumed)? */
static inline int
null_next(Scan *s)
{
    ws(s);
    return literal(s, "null", 4);
}


/* Per byte: its value as a hex digit, or -1; and whether it ends the fast scan of a string (the closing quote, an
 * escape, a control character), or is whitespace to bytes.fromhex. Filled at import. */
static signed char HEX[256];
static unsigned char STOP[256], HEX_SPACE[256];

static void
init_tables(void)
{
    memset(HEX, -1, sizeof HEX);
    for (int c = 0; c < 10; c++)
        HEX['0' + c] = (signed char)c;
    for (int c = 0; c < 6; c++)
        HEX['a' + c] = HEX['A' + c] = (signed char)(10 + c);
    for (int c = 0; c < 0x20; c++)
        STOP[c] = 1;
    STOP['"'] = STOP['\\'] = 1;
    HEX_SPACE[' '] = 1;
    for (int c = '\t'; c <= '\r'; c++)
        HEX_SPACE[c] = 1;
}

static int
hex4(const unsigned char *q, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int d = HEX[q[i]];
        if (d < 0)
            return 1;
        v = v * 16 + (unsigned)d;
    }
    *out = v;
    return 0;
}

/* A JSON string next: *str and *n are its decoded bytes (valid until the next string is read). */
static int
string(Scan *s, const unsigned char **str, size_t *n)
{
    ws(s);
    if (s->p >= s->end || *s->p != '"')
        return 1;
    const unsigned char *q = ++s->p, *end = s->end;
    unsigned high = 0;
#ifdef __SSE2__
    /* 16 bytes at a time to the first quote, backslash, control or non-ASCII byte (then byte by byte) */
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\'), space = _mm_set1_epi8(0x20);
    while (end - q >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)q);
        __m128i stop = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                                    _mm_cmplt_epi8(v, space)); /* (signed: bytes >= 0x80 compare below too) */
        int mask = _mm_movemask_epi8(stop);
        if (mask) {
            q += __builtin_ctz((unsigned)mask);
            break;
        }
        q += 16;
    }
#endif
    while (q < end && !STOP[*q])
        high |= *q++;
    if (q < end && *q == '"') { /* the usual case: no escape */
        if ((high & 0x80) && !utf8_valid(s->p, (size_t)(q - s->p)))
            return 1;
        *str = s->p;
        *n = (size_t)(q - s->p);
        s->p = q + 1;
        return 0;
    }
    Buf *b = &s->c.scratch;
    b->len = 0;
    q = s->p;
    while (1) {
        const unsigned char *run = q;
        while (q < end && !STOP[*q])
            q++;
        if (q > run && buf_put(b, run, (size_t)(q - run)) < 0)
            return -1;
        if (q >= end || *q < 0x20)
            return 1;
        if (*q == '"')
            break;
        if (end - q < 2)
            return 1;
        unsigned char e = q[1], c;
        q += 2;
        switch (e) {
        case '"': c = '"'; break;
        case '\\': c = '\\'; break;
        case '/': c = '/'; break;
        case 'b': c = '\b'; break;
        case 'f': c = '\f'; break;
        case 'n': c = '\n'; break;
        case 'r': c = '\r'; break;
        case 't': c = '\t'; break;
        case 'u': {
            unsigned u, lo;
            if (end - q < 4 || hex4(q, &u))
                return 1;
            q += 4;
            if (u >= 0xDC00 && u <= 0xDFFF)
                return 1; /* a lone low surrogate */
            if (u >= 0xD800 && u <= 0xDBFF) {
                if (end - q < 6 || q[0] != '\\' || q[1] != 'u' || hex4(q + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                    return 1; /* a lone high surrogate */
                q += 6;
                u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
            }
            unsigned char enc[4];
            size_t k;
            if (u < 0x80) {
                enc[0] = (unsigned char)u;
                k = 1;
            }
            else if (u < 0x800) {
                enc[0] = (unsigned char)(0xC0 | (u >> 6));
                enc[1] = (unsigned char)(0x80 | (u & 0x3F));
                k = 2;
            }
            else if (u < 0x10000) {
                enc[0] = (unsigned char)(0xE0 | (u >> 12));
                enc[1] = (unsigned char)(0x80 | ((u >> 6) & 0x3F));
                enc[2] = (unsigned char)(0x80 | (u & 0x3F));
                k = 3;
            }
            else {
                enc[0] = (unsigned char)(0xF0 | (u >> 18));
                enc[1] = (unsigned char)(0x80 | ((u >> 12) & 0x3F));
                enc[2] = (unsigned char)(0x80 | ((u >> 6) & 0x3F));
                enc[3] = (unsigned char)(0x80 | (u & 0x3F));
                k = 4;
            }
            if (buf_put(b, enc, k) < 0)
                return -1;
            continue;
        }
        default: return 1;
        }
        if (buf_put(b, &c, 1) < 0)
            return -1;
    }
    if (!utf8_valid((const unsigned char *)b->data, b->len))
        return 1;
    *str = (const unsigned char *)b->data;
    *n = b->len;
    s->p = q + 1;
    return 0;
}

/* An integer next, a JSON integer or a quoted one (digits, with a '-' only if `neg_ok`), at most `max` (and at
 * least -max-1 when negative) -> *out. */
static int
integer(Scan *s, int neg_ok, uint64_t max, int64_t *out_signed, uint64_t *out_unsigned)
{
    ws(s);
    const unsigned char *q = s->p, *end = s->end;
    int quoted = q < end && *q == '"';
    q += quoted;
    int neg = q < end && *q == '-';
    q += neg;
    if (neg && !neg_ok)
        return 1;
    const unsigned char *digits = q;
    uint64_t v = 0;
    while (q < end && is_digit(*q)) {
        unsigned d = *q - '0';
        if (v > (UINT64_MAX - d) / 10)
            return 1;
        v = v * 10 + d;
        q++;
    }
    if (q == digits)
        return 1;
    if (quoted) {
        if (q >= end || *q != '"')
            return 1;
        q++;
    }
    else if ((*digits == '0' && q - digits > 1) || (q < end && (*q == '.' || *q == 'e' || *q == 'E')))
        return 1; /* not JSON, or a number ParseDict reads as a float first */
    if (v > max + (uint64_t)neg)
        return 1;
    if (out_signed)
        *out_signed = neg ? (int64_t)(0 - v) : (int64_t)v;
    if (out_unsigned)
        *out_unsigned = v;
    s->p = q;
    return 0;
}

/* A JSON number next that is finite as a double (a doubleValue: its value is not needed). */
static int
finite_number(Scan *s)
{
    ws(s);
    const unsigned char *q = s->p;
    double v;
    if (parse_number(&q, s->end, &v, 0) || !isfinite(v))
        return 1;
    s->p = q;
    return 0;
}

static int
boolean(Scan *s)
{
    ws(s);
    return literal(s, "true", 4) || literal(s, "false", 5) ? 0 : 1;
}

static int
any_string(Scan *s)
{
    const unsigned char *str;
    size_t n;
    return string(s, &str, &n);
}

/* ---------------------------------------------------------------------------------------------- objects, lists */

/* Object members: `member(s, ctx, key, n, &seen)` reads one value; it returns 1 for an unknown key. */
typedef int (*Member)(Scan *s, void *ctx, const unsigned char *key, size_t n, unsigned *seen);

static int
object(Scan *s, Member member, void *ctx)
{
    if (!eat(s, '{'))
        return 1;
    if (++s->depth > MAX_DEPTH)
        return 1;
    unsigned seen = 0;
    if (!eat(s, '}')) {
        do {
            const unsigned char *key;
            size_t n;
            TRY(string(s, &key, &n));
            if (!eat(s, ':'))
                return 1;
            TRY(member(s, ctx, key, n, &seen));
        } while (eat(s, ','));
        if (!eat(s, '}'))
            return 1;
    }
    s->depth--;
    return 0;
}

/* A list (or null: none) of what `item` reads; null elements decline. */
typedef int (*Item)(Scan *s, void *ctx);

static int
list(Scan *s, Item item, void *ctx)
{
    if (null_next(s))
        return 0;
    if (!eat(s, '['))
        return 1;
    if (eat(s, ']'))
        return 0;
    do {
        if (null_next(s))
            return 1;
        TRY(item(s, ctx));
    } while (eat(s, ','));
    return eat(s, ']') ? 0 : 1;
}

/* Match `key` against the names; each field at most once (bit `i` of *seen). -1 for no match. */
static int
field(const unsigned char *key, size_t n, const Name *names, unsigned *seen)
{
    for (int i = 0; names[i].name; i++)
        if (names[i].len == n && !memcmp(key, names[i].name, n)) {
            if (*seen & (1u << i))
                return -2;
            *seen |= 1u << i;
            return i;
        }
    return -1;
}

#define FIELD(names)                                                                                              \
    int f = field(key, n, names, seen);                                                                           \
    if (f < 0)                                                                                                    \
        return 1;                                                                                                 \
    if (null_next(s))                                                                                             \
        return 0

static int u32(Scan *s) { return integer(s, 0, UINT32_MAX, NULL, NULL); }
static int u64(Scan *s, uint64_t *v) { return integer(s, 0, UINT64_MAX, NULL, v); }

/* An enum: a number (open enums: any int32), or the name of one of `names` (numbered from 0). */
static int
enum32(Scan *s, const Name *names, int32_t *v)
{
    int64_t x;
    const unsigned char *at = s->p;
    int r = integer(s, 1, INT32_MAX, &x, NULL);
    if (r == 0) {
        *v = (int32_t)x;
        return 0;
    }
    s->p = at;
    const unsigned char *name;
    size_t n;
    TRY(string(s, &name, &n));
    for (int32_t i = 0; names[i].name; i++)
        if (names[i].len == n && !memcmp(name, names[i].name, n)) {
            *v = i;
            return 0;
        }
    return 1;
}

static const Name SPAN_KINDS[] = {N("SPAN_KIND_UNSPECIFIED"), N("SPAN_KIND_INTERNAL"), N("SPAN_KIND_SERVER"),
    N("SPAN_KIND_CLIENT"), N("SPAN_KIND_PRODUCER"), N("SPAN_KIND_CONSUMER"), {NULL, 0}};
static const Name STATUS_CODES[] = {N("STATUS_CODE_UNSET"), N("STATUS_CODE_OK"), N("STATUS_CODE_ERROR"), {NULL, 0}};

/* ------------------------------------------------------------------------------------------- attribute values */

/* Where a key/value pair's parts go: a pool (a row per pair), or nowhere (validated only). */
typedef struct {
    Buf *pool; /* NULL: discard */
    int has_value, has_text, has_int;
    int64_t int_value;
} Pair;

static int any_value(Scan *s, void *pair);
static int key_value(Scan *s, void *pool);

static const Name VALUE_LIST_FIELDS[] = {N("values"), {NULL, 0}};

static int
values_of_any(Scan *s, void *ctx, const unsigned char *key, size_t n, unsigned *seen)
{
    FIELD(VALUE_LIST_FIELDS);
    return list(s, any_value, NULL);
}

static int
values_of_kv(Scan *s, void *ctx, const unsigned char *key, size_t n, unsigned *seen)
{
    FIELD(VALUE_LIST_FIELDS);
    return list(s, key_value, NULL);
}

static const Name ANY_VALUE_FIELDS[] = {N("stringValue"), N("boolValue"), N("intValue"), N("doubleValue"),
    N("arrayValue"), N("kvlistValue"), {NULL, 0}};

static int
any_value_member(Scan *s, void *ctx, const unsigned char *key, size_t n, unsigned *seen)
{
    Pair *pair = ctx;
    if (*seen)
        return 1; /* a oneof: a second member (even a null one) declines */
    FIELD(ANY_VALUE_FIELDS);
    switch (f) {
    case 0: {
        const unsigned char *str;
        size_t len;
        TRY(string(s, &str, &len));
        if (pair && pair->pool) {
            pair->has_text = 1;
            if (buf_put(&pair->pool[A_TDATA], str, len) < 0)
                return -1;
        }
        return 0;
    }
    case 1: return boolean(s);
    case 2: {
        int64_t v;
        TRY(integer(s, 1, INT64_MAX, &v, NULL));
        if (pair) {
            pair->has_int = 1;
            pair->int_value = v;
        }
        return 0;
    }
    case 3: return finite_number(s);
    case 4: return object(s, values_of_any, NULL);
    default: return object(s, values_of_kv, NULL);
    }
}

/* An AnyValue object; `ctx` is the Pair it fills, or NULL. */
static int
any_value(Scan *s, void *ctx)
{
    return object(s, any_value_member, ctx);
}

static const Name KEY_VALUE_FIELDS[] = {N("key"), N("value"), {NULL, 0}};

static int
key_value_member(Scan *s, void *ctx, const unsigned char *key, size_t n, unsigned *seen)
{
    Pair *pair = ctx;
    FIELD(KEY_VALUE_FIELDS);
    if (f == 0) {
        const unsigned char *str;
        size_t len;
        TRY(string(s, &str, &len));
        if (pair->pool && buf_put(&pair->pool[A_KDATA], str, len) < 0)
            return -1;
        return 0;
    }
    pair->has_value = 1;
    return any_value(s, pair->pool ? pair : NULL);
}

/* A KeyValue object, a row of the pool `ctx` (a Buf[A_NBUFS]), or validated only (NULL). */
static int
key_value(Scan *s, void *ctx)
{
    Pair pair = {ctx, 0, 0, 0, 0};
    TRY(object(s, key_value_member, &pair));
    return ctx == NULL ? 0 : cols_pair(ctx, pair.has_value, pair.has_text, pair.has_int, pair.int_value);
}

/* ------------------------------------------------------------------------------------------------- messages */

/* An id: a string; hex of even length decodes into `into` (if any), other strings are an empty id, except a span's
 * trace id (`trace`) of a UUID's length: the reference reads a UUID with dashes. */
static int
id(Scan *s, Buf *into, int trace)
{
    const unsigned char *str;
    size_t n;
    TRY(string(s, &str, &n));
    int hex = n % 2 == 0;
    for (size_t i = 0; i < n; i++) {
        if (HEX_SPACE[str[i]])
            return 1; /* bytes.fromhex skips whitespace between pairs */
        hex &= HEX[str[i]] >= 0;
    }
    if (!hex && trace && n == 36)
        return 1;
    if (!hex || into == NULL)
        return 0;
    if (buf_reserve(into, n / 2) < 0)
        return -1;
    for (size_t i = 0; i < n; i += 2)
        into->data[into->len++] = (char)(HEX[str[i]] << 4 | HEX[str[i + 1]]);
    return 0;
}

static const Name STATUS_FIELDS[] = {N("message"), N("code"), {NULL, 0}};

static int
status_member(Scan *s, void *ctx, const unsigned char *key, size_t n, unsigned *seen)
{
    FIELD(STATUS_FIELDS);
    return f == 0 ? any_string(s) : enum32(s, STATUS_CODES, ctx);
}

static const Name EVENT_FIELDS[] = {N("timeUnixNano"), N("name"), N("attributes"), N("droppedAttributesCount"),
    {NULL, 0}};

static int
event_member(Scan *s, void *ctx, const unsigned char *key, size_t n, unsigned *seen)
{
    FIELD(EVENT_FIELDS);
    switch (f) {
    case 0: return u64(s, NULL);
    case 1: return any_string(s);
    case 2: return list(s, key_value, NULL);
    default: return u32(s);
    }
}

static int
event(Scan *s, void *ctx)
{
    return object(s, event_member, NULL);
}

static const Name LINK_FIELDS[] = {N("traceId"), N("spanId"), N("traceState"), N("attributes"),
    N("droppedAttributesCount"), N("flags"), {NULL, 0}};

static int
link_member(Scan *s, void *ctx, const unsigned char *key, size_t n, unsigned *seen)
{
    FIELD(LINK_FIELDS);
    switch (f) {
    case 0:
    case 1: return id(s, NULL, 0);
    case 2: return any_string(s);
    case 3: return list(s, key_value, NULL);
    default: return u32(s);
    }
}

static int
span_link(Scan *s, void *ctx)
{
    return object(s, link_member, NULL);
}

typedef struct {
    int32_t kind, code;
    uint64_t start, end;
} Span;

static const Name SPAN_FIELDS[] = {N("traceId"), N("spanId"), N("traceState"), N("parentSpanId"), N("flags"),
    N("name"), N("kind"), N("startTimeUnixNano"), N("endTimeUnixNano"), N("attributes"), N("droppedAttributesCount"),
    N("events"), N("droppedEventsCount"), N("links"), N("droppedLinksCount"), N("status"), {NULL, 0}};

static int
span_member(Scan *s, void *ctx, const unsigned char *key, size_t n, unsigned *seen)
{
    Span *span = ctx;
    FIELD(SPAN_FIELDS);
    switch (f) {
    case 0: return id(s, &s->c.out[S_TDATA], 1);
    case 1: return id(s, &s->c.out[S_SDATA], 0);
    case 3: return id(s, NULL, 0);
    case 2:   /* traceState */
    case 5: { /* name */
        const unsigned char *str;
        size_t len;
        TRY(string(s, &str, &len));
        return buf_put(&s->c.out[f == 2 ? S_XDATA : S_NDATA], str, len) < 0 ? -1 : 0;
    }
    case 6: return enum32(s, SPAN_KINDS, &span->kind);
    case 7: return u64(s, &span->start);
    case 8: return u64(s, &span->end);
    case 9: return list(s, key_value, &s->c.out[SPAN_POOL]);
    case 11: return list(s, event, NULL);
    case 13: return list(s, span_link, NULL);
    case 15: return object(s, status_member, &span->code);
    default: return u32(s); /* flags and the dropped counts */
    }
}

static int
span(Scan *s, void *ctx)
{
    Span span = {0, 0, 0, 0};
    TRY(object(s, span_member, &span));
    return cols_span(&s->c, s->line, span.kind, span.start, span.end, span.code);
}

static const Name SCOPE_FIELDS[] = {N("name"), N("version"), N("attributes"), N("droppedAttributesCount"), {NULL, 0}};

static int
scope_member(Scan *s, void *ctx, const unsigned char *key, size_t n, unsigned *seen)
{
    FIELD(SCOPE_FIELDS);
    return f <= 1 ? any_string(s) : f == 2 ? list(s, key_value, NULL) : u32(s);
}

static const Name SCOPE_SPANS_FIELDS[] = {N("scope"), N("spans"), N("schemaUrl"), {NULL, 0}};

static int
scope_spans_member(Scan *s, void *ctx, const unsigned char *key, size_t n, unsigned *seen)
{
    FIELD(SCOPE_SPANS_FIELDS);
    return f == 0 ? object(s, scope_member, NULL) : f == 1 ? list(s, span, NULL) : any_string(s);
}

static int
scope_spans(Scan *s, void *ctx)
{
    return object(s, scope_spans_member, NULL);
}

static const Name RESOURCE_FIELDS[] = {N("attributes"), N("droppedAttributesCount"), {NULL, 0}};

static int
resource_member(Scan *s, void *ctx, const unsigned char *key, size_t n, unsigned *seen)
{
    FIELD(RESOURCE_FIELDS);
    return f == 0 ? list(s, key_value, &s->c.out[RES_POOL]) : u32(s);
}

static const Name RESOURCE_SPANS_FIELDS[] = {N("resource"), N("scopeSpans"), N("schemaUrl"), {NULL, 0}};

static int
resource_spans_member(Scan *s, void *ctx, const unsigned char *key, size_t n, unsigned *seen)
{
    FIELD(RESOURCE_SPANS_FIELDS);
    return f == 0 ? object(s, resource_member, NULL) : f == 1 ? list(s, scope_spans, NULL) : any_string(s);
}

static int
resource_spans(Scan *s, void *ctx)
{
    s->c.resources++; /* its spans name it while it is read; its attributes close when it does */
    TRY(object(s, resource_spans_member, NULL));
    return cols_owner(&s->c.out[RES_POOL]);
}

static const Name REQUEST_FIELDS[] = {N("resourceSpans"), {NULL, 0}};

static int
request_member(Scan *s, void *ctx, const unsigned char *key, size_t n, unsigned *seen)
{
    FIELD(REQUEST_FIELDS);
    return list(s, resource_spans, NULL);
}

/* ------------------------------------------------------------------------------------------------ the block */

/* Read the lines of `data` into s->c (lines declined: rolled back and listed in `declined`; blank lines are skipped);
 * `first`, if given, gets each line's first span index (int64). The number of lines, or -1 with a Python error. */
static Py_ssize_t
scan_lines(Scan *s, const Py_buffer *view, PyObject *declined, Buf *first)
{
    const unsigned char *p = view->buf, *end = p + view->len;
    Py_ssize_t lines = 0;
    Mark mark;
    while (p < end) {
        const unsigned char *nl = memchr(p, '\n', (size_t)(end - p));
        const unsigned char *line_end = nl ? nl : end;
        s->p = p;
        s->end = line_end;
        s->line = (int32_t)lines;
        s->depth = 0;
        if (first && put_i64(first, s->c.spans) < 0)
            return -1;
        ws(s);
        const unsigned char *q = s->p;
        while (q < line_end && (*q == '\v' || *q == '\f' || *q == ' ' || *q == '\t' || *q == '\r'))
            q++;
        if (q < line_end) { /* not blank (as bytes.strip() sees it) */
            cols_mark(&s->c, &mark);
            int r = object(s, request_member, NULL);
            if (r == 0) {
                ws(s);
                r = s->p == line_end ? 0 : 1;
            }
            if (r < 0)
                return -1;
            if (r) { /* roll the line back; the reference reads it */
                cols_rollback(&s->c, &mark);
                if (cols_decline(declined, lines) < 0)
                    return -1;
            }
        }
        lines++;
        p = nl ? nl + 1 : end;
    }
    return lines;
}

/* scan(data, count) -> (declined, spans, resources, span columns..., span pool, resource pool), or None when
 * `data` does not hold `count` lines; events(data, count, span_roles, resource_roles, request_kinds, client, server,
 * latency_max_ms) -> their events (the tuple of _otlpproto.pyi's events; _spanevents.h), or None likewise. */
static PyObject *
read_block(PyObject *const *args, Py_ssize_t nargs, PyObject *mapping_args)
{
    Py_buffer view;
    Py_ssize_t count;
    count = PyLong_AsSsize_t(args[1]);
    if (count == -1 && PyErr_Occurred())
        return NULL;
    Mapping m;
    if (mapping_args && mapping_parse(mapping_args, 2, &m) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        if (mapping_args)
            mapping_release(&m);
        return NULL;
    }
    Scan s;
    memset(&s, 0, sizeof s);
    Buf first = {NULL, 0, 0};
    PyObject *declined = PyList_New(0), *result = NULL;
    Py_ssize_t lines;
    if (cols_begin(&s.c) < 0 || declined == NULL ||
        (lines = scan_lines(&s, &view, declined, mapping_args ? &first : NULL)) < 0)
        goto done;
    if (lines != count) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    result = mapping_args ? cols_events(&s.c, &first, &m, declined) : cols_result(declined, &s.c);
done:
    PyMem_Free(first.data);
    Py_XDECREF(declined);
    if (mapping_args)
        mapping_release(&m);
    cols_done(&s.c);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *
scan(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "scan(data, count)");
        return NULL;
    }
    return read_block(args, nargs, NULL);
}

static PyObject *
events(PyObject *module, PyObject *args)
{
    if (PyTuple_GET_SIZE(args) != 8) {
        PyErr_SetString(PyExc_TypeError,
                        "events(data, count, span_roles, resource_roles, request_kinds, client, server, latency_max)");
        return NULL;
    }
    return read_block(&PyTuple_GET_ITEM(args, 0), 2, args);
}

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))scan, METH_FASTCALL,
     "scan(data, count) -> the span columns of a block of OTLP JSON lines, and the lines declined (see "
     "_otlpjson.c)."},
    {"events", events, METH_VARARGS,
     "events(data, count, span_roles, resource_roles, request_kinds, client, server, latency_max_ms) -> the events "
     "of a block of OTLP JSON lines, the span mapping done in the pass (see _spanevents.h)."},
    {"gather", span_gather, METH_VARARGS,
     "gather(codes, texts) -> (offsets, data): the string column of texts[code] per int32 code (see "
     "_spanevents.h)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "drainpipe.native._otlpjson",
    "OTLP JSON lines -> span columns in one pass (see _otlpjson.c).", -1, methods,
};

PyMODINIT_FUNC
PyInit__otlpjson(void)
{
    init_tables();
    return PyModule_Create(&module);
}
