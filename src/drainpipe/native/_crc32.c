/* drainpipe.native._crc32: CRC-32 (zlib's: ISO-HDLC, reflected polynomial 0xEDB88320) by carry-less multiplication.
 *
 * Why C: the write-ahead log checks every record it writes and every record it reads back (the feeder) with
 * CRC-32, and zlib's byte-table CRC runs at about 2.6 GB/s here: 2.6% of a saturated `serve`'s CPU, on the loop that
 * answers the requests and on the feeder. Folding 64 bytes at a time with PCLMULQDQ (Intel's "Fast CRC Computation
 * for Generic Polynomials Using PCLMULQDQ", the constants of its bit-reflected CRC-32 as zlib's SIMD paths use them)
 * gives the same values several times faster, so the log's format and its CRCs stay as they are.
 *
 * crc32(data, value=0) -> int
 *   What zlib.crc32(data, value) returns, for any buffer. The GIL is kept: a log record is checked in microseconds,
 *   and letting the GIL go around so short a call costs the loop a hand-over of it (the engine's threads wait for
 *   it); from LONG_INPUT bytes on, it is let go.
 *
 * The module imports only on a CPU with PCLMULQDQ and SSE4.1 (ImportError otherwise): zlib's is the faster path
 * without them, and drainpipe.native falls back to it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_FOLD 1
#endif

#define LONG_INPUT (4 << 20)

static uint32_t table[256];

static void
make_table(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        table[n] = c;
    }
}

/* the register (not inverted) over n bytes, a byte at a time */
static uint32_t
crc_bytes(uint32_t crc, const unsigned char *p, size_t n)
{
    while (n--)
        crc = table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

#ifdef HAVE_FOLD
/* the register over len bytes, len >= 64 and a multiple of 16: four 128-bit lanes folded 64 bytes at a time, then
 * into one, then reduced to 32 bits (Barrett) */
__attribute__((target("pclmul,sse4.1"))) static uint32_t
crc_fold(uint32_t crc, const unsigned char *buf, size_t len)
{
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596, 0x0154442bd4);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009e, 0x01751997d0);
    const __m128i k5k0 = _mm_set_epi64x(0x0000000000, 0x0163cd6124);
    const __m128i poly = _mm_set_epi64x(0x01f7011641, 0x01db710641);
    const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
    __m128i x1, x2, x3, x4, x5, x6, x7, x8;

    x1 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
    x2 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
    x3 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
    x4 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    buf += 64;
    len -= 64;
    while (len >= 64) {
        x5 = _mm_clmulepi64_si128(x1, k1k2, 0x00);
        x6 = _mm_clmulepi64_si128(x2, k1k2, 0x00);
        x7 = _mm_clmulepi64_si128(x3, k1k2, 0x00);
        x8 = _mm_clmulepi64_si128(x4, k1k2, 0x00);
        x1 = _mm_clmulepi64_si128(x1, k1k2, 0x11);
        x2 = _mm_clmulepi64_si128(x2, k1k2, 0x11);
        x3 = _mm_clmulepi64_si128(x3, k1k2, 0x11);
        x4 = _mm_clmulepi64_si128(x4, k1k2, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), _mm_loadu_si128((const __m128i *)(buf + 0x00)));
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), _mm_loadu_si128((const __m128i *)(buf + 0x10)));
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), _mm_loadu_si128((const __m128i *)(buf + 0x20)));
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), _mm_loadu_si128((const __m128i *)(buf + 0x30)));
        buf += 64;
        len -= 64;
    }
    /* four lanes into one */
    x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
    x1 = _mm_clmulepi64_si128(x1, k3k4, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
    x1 = _mm_clmulepi64_si128(x1, k3k4, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
    x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
    x1 = _mm_clmulepi64_si128(x1, k3k4, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);
    /* the remaining blocks of 16 */
    while (len >= 16) {
        x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
        x1 = _mm_clmulepi64_si128(x1, k3k4, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, _mm_loadu_si128((const __m128i *)buf)), x5);
        buf += 16;
        len -= 16;
    }
    /* 128 bits to 64 */
    x2 = _mm_clmulepi64_si128(x1, k3k4, 0x10);
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, low32);
    x1 = _mm_xor_si128(_mm_clmulepi64_si128(x1, k5k0, 0x00), x2);
    /* Barrett reduction to 32 bits */
    x2 = _mm_and_si128(x1, low32);
    x2 = _mm_clmulepi64_si128(x2, poly, 0x10);
    x2 = _mm_and_si128(x2, low32);
    x2 = _mm_clmulepi64_si128(x2, poly, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}
#endif

static uint32_t
crc32_of(uint32_t value, const unsigned char *p, size_t n)
{
    uint32_t crc = ~value;
#ifdef HAVE_FOLD
    if (n >= 64) {
        size_t blocks = n & ~(size_t)15;
        crc = crc_fold(crc, p, blocks);
        p += blocks;
        n -= blocks;
    }
#endif
    return ~crc_bytes(crc, p, n);
}

static PyObject *
crc32(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "crc32(data, value=0)");
        return NULL;
    }
    uint32_t value = 0;
    if (nargs == 2) {
        /* as zlib: any int, taken modulo 2**32 */
        unsigned long v = PyLong_AsUnsignedLongMask(args[1]);
        if (v == (unsigned long)-1 && PyErr_Occurred())
            return NULL;
        value = (uint32_t)v;
    }
    Py_buffer buf;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t crc;
    if (buf.len >= LONG_INPUT) {
        Py_BEGIN_ALLOW_THREADS
        crc = crc32_of(value, buf.buf, (size_t)buf.len);
        Py_END_ALLOW_THREADS
    }
    else
        crc = crc32_of(value, buf.buf, (size_t)buf.len);
    PyBuffer_Release(&buf);
    return PyLong_FromUnsignedLong(crc);
}

static PyMethodDef methods[] = {
    {"crc32", (PyCFunction)(void (*)(void))crc32, METH_FASTCALL, "crc32(data, value=0): zlib.crc32's value."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_crc32", "CRC-32 by carry-less multiplication.", -1,
                                    methods};

PyMODINIT_FUNC
PyInit__crc32(void)
{
#ifdef HAVE_FOLD
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("pclmul") || !__builtin_cpu_supports("sse4.1")) {
        PyErr_SetString(PyExc_ImportError, "_crc32: this CPU has no PCLMULQDQ (zlib.crc32 is the faster path)");
        return NULL;
    }
#else
    PyErr_SetString(PyExc_ImportError, "_crc32: built without the carry-less multiplication path");
    return NULL;
#endif
    make_table();
    return PyModule_Create(&module);
}
