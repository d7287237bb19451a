/* drainpipe.native: the hash of a byte string that the scanners' open-addressing tables use (included by
 * _columns.h, for the JSON and CSV scanners' dictionary-encoded columns, and by _spanevents.h, for the OTLP passes'
 * endpoints): eight bytes a step, each mixed in by a multiply and a shift.
 */
#ifndef DRAINPIPE_HASH_H
#define DRAINPIPE_HASH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint64_t
bytes_hash(const unsigned char *s, size_t n)
{
    uint64_t h = (uint64_t)n * 0x9E3779B97F4A7C15ull, w;
    for (; n >= 8; s += 8, n -= 8) {
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
    }
    if (n) { /* the last 1-7 bytes, little-endian (a loop, not a memcpy of a variable length: no call) */
        w = 0;
        for (size_t i = 0; i < n; i++)
            w |= (uint64_t)s[i] << (8 * i);
        h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
        h ^= h >> 32;
    }
    return h;
}

#endif
