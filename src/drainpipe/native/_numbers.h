/* drainpipe.native (the input scanners): JSON numbers read from bytes as Python reads them (included by the C scanners: _columns.h for
 * JSON Lines and CSV, _otlpjson.c).
 */
#ifndef DRAINPIPE_NUMBERS_H
#define DRAINPIPE_NUMBERS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static inline int
is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* The sign and integer part's first digit of a JSON number at *pp: *neg set, *pp moved to that digit; 1 to decline
 * (no digit, or a leading zero followed by a digit: not JSON). */
static inline int
number_start(const unsigned char **pp, const unsigned char *end, int *neg)
{
    const unsigned char *p = *pp;
    *neg = *p == '-';
    p += *neg;
    if (p >= end || !is_digit(*p) || (*p == '0' && p + 1 < end && is_digit(p[1])))
        return 1;
    *pp = p;
    return 0;
}

/* A JSON number at *pp -> *out, correctly rounded: an exact fast path when the digits fit 2^53 and the power of ten
 * is exact (Clinger's condition), else PyOS_string_to_double, which is what float() uses. `json_int`: an integer
 * converts as json.loads + float() convert it, so "-0" is 0.0 (float(int("-0"))); without it as float("-0") does,
 * -0.0. 0, or 1 to decline. */
static inline int
parse_number(const unsigned char **pp, const unsigned char *end, double *out, int json_int)
{
    const unsigned char *p = *pp, *start = p;
    int neg, integer = 1, exact = 1;
    uint64_t m = 0;   /* the significant digits, at most 19 of them */
    int digits = 0;   /* digits in m, counted from the first non-zero one */
    int64_t e10 = 0;  /* the value is m * 10^e10 (if exact) */
    if (number_start(&p, end, &neg))
        return 1;
    if (*p == '0')
        p++;
    else
        for (; p < end && is_digit(*p); p++) {
            if (digits < 19) {
                m = m * 10 + (uint64_t)(*p - '0');
                digits++;
            }
            else {
                e10++;
                exact = 0;
            }
        }
    if (p < end && *p == '.') {
        integer = 0;
        p++;
        if (p >= end || !is_digit(*p))
            return 1;
        for (; p < end && is_digit(*p); p++) {
            if (digits < 19) {
                m = m * 10 + (uint64_t)(*p - '0');
                e10--;
                if (m)
                    digits++;
            }
            else
                exact = 0;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        int eneg = 0;
        int64_t e = 0;
        integer = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            eneg = *p++ == '-';
        if (p >= end || !is_digit(*p))
            return 1;
        for (; p < end && is_digit(*p); p++)
            if (e < 100000)
                e = e * 10 + (*p - '0');
        e10 += eneg ? -e : e;
    }
    *pp = p;
    double v;
    if (exact && m <= ((uint64_t)1 << 53) && e10 >= -22 && e10 <= 22) {
        v = e10 < 0 ? (double)m / POW10[-e10] : (double)m * POW10[e10];
        v = neg ? -v : v;
    }
    else {
        /* Rare: long mantissas or large exponents; the same correctly rounded conversion float() makes. */
        char buf[128];
        size_t n = (size_t)(p - start);
        if (n >= sizeof buf)
            return 1;
        memcpy(buf, start, n);
        buf[n] = '\0';
        v = PyOS_string_to_double(buf, NULL, NULL);
        if (v == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return 1;
        }
    }
    *out = json_int && integer && v == 0.0 ? 0.0 : v;
    return 0;
}

/* An integer within int64 at *pp; 0, or 1 to decline (not an integer, or too long). */
static inline int
parse_int64(const unsigned char **pp, const unsigned char *end, int64_t *out)
{
    const unsigned char *p = *pp;
    int neg, digits = 0;
    uint64_t v = 0;
    if (number_start(&p, end, &neg))
        return 1;
    if (*p == '0')
        p++;
    else {
        while (p < end && is_digit(*p)) {
            if (++digits > 18) /* 18 digits always fit int64; longer values are not timestamps anyway */
                return 1;
            v = v * 10 + (uint64_t)(*p - '0');
            p++;
        }
    }
    if (p < end && (*p == '.' || *p == 'e' || *p == 'E'))
        return 1; /* a float ts: the per-line rules reject it with their reason */
    *pp = p;
    *out = neg ? -(int64_t)v : (int64_t)v;
    return 0;
}

#endif /* DRAINPIPE_NUMBERS_H */
