/* Fuzz target: the structural verifier (csrc/verify.c) over a whole file
 * in memory, on every tree and with a named DB alone. */
#include "fuzz_common.h"

static volatile unsigned sink;

static void report(void *ctx, uint64_t pgno, const char *msg)
{
    (void)ctx;
    sink += (unsigned)pgno + (unsigned)strlen(msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    lio_membuf mb = {data, size};
    lio_source src;
    lio_env *env;
    lio_meta snap;
    lio_error err;
    lio_verify_opts o;
    lio_verify_stats st;

    lio_mem_source(&src, &mb);
    if (lio_env_open(&env, &src, 64 * 4096, 0, &err))
        return 0;
    if (lio_env_snapshot(env, 0, &snap, &err) == 0) {
        memset(&o, 0, sizeof o);
        o.report = report;
        o.max_problems = 200;
        lio_verify(env, &snap, &o, &st, &err);
        /* the first named DB alone (if the main DB's first key names one) */
        {
            lio_cursor *c;
            lio_val k, v;
            if (lio_cursor_open(&c, env, &snap, &snap.main_db, &err) == 0) {
                if (lio_cursor_get(c, &k, &v, LIO_FIRST) == 0 && v.size == 48 &&
                    k.size < 512) {
                    uint8_t name[512];
                    memcpy(name, k.data, k.size);
                    o.db_name = name;
                    o.db_name_len = k.size;
                    lio_verify(env, &snap, &o, &st, &err);
                }
                lio_cursor_close(c);
            }
        }
    }
    lio_env_close(env);
    return 0;
}
