/* Binding ggml: dlopen the llama_cpp package's own ggml shared objects (already mapped by
 * `import llama_cpp`, so RTLD_NOLOAD finds them; never a second copy of ggml-base), check
 * ggml_version() against the pinned range, and fill the function table (api.h) by dlsym. */
#define _GNU_SOURCE /* RTLD_NOLOAD, access */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device/ggml/api.h"
#include "pi_internal.h"

/* the sonames llama_cpp's libllama links (its RUNPATH is its own folder) */
static const char *const LIBS[] = {"libggml-base.so.0", "libggml.so.0", "libggml-cpu.so.0"};
enum { N_LIBS = 3 };

static pi_ggml_api g_api;
static int g_bound;
static char g_dir[1024];
static char g_version[64];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

const pi_ggml_api *pi_ggml(void) {
    if (!__atomic_load_n(&g_bound, __ATOMIC_ACQUIRE)) {
        pi_set_error(PI_ERR_INVALID, "ggml is not bound: call pi_ggml_bind (powerinfer_backend.engine.ggml.bind) first");
        return NULL;
    }
    return &g_api;
}

/* "a.b.c" -> a * 1e6 + b * 1e3 + c (missing parts are 0); -1 when not a version */
static long parse_version(const char *s) {
    long part[3] = {0, 0, 0};
    int n = 0;
    const char *p = s;
    while (n < 3) {
        char *end;
        const long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 999) return -1;
        part[n++] = v;
        if (*end != '.') break;
        p = end + 1;
    }
    return part[0] * 1000000 + part[1] * 1000 + part[2];
}

static void *lookup(void *const h[N_LIBS], const char *name) {
    for (int i = 0; i < N_LIBS; i++) {
        void *f = dlsym(h[i], name);
        if (f != NULL) return f;
    }
    return NULL;
}

/* open the three libraries of lib_dir, preferring the copies already mapped */
static int open_libs(const char *lib_dir, void *h[N_LIBS]) {
    for (int i = 0; i < N_LIBS; i++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/%s", lib_dir, LIBS[i]);
        h[i] = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
        if (h[i] == NULL) h[i] = dlopen(path, RTLD_NOW); /* not mapped yet: this file is the one llama_cpp maps */
        if (h[i] == NULL) {
            const char *why = dlerror();
            for (int j = 0; j < i; j++) dlclose(h[j]);
            return pi_set_error(PI_ERR_UNSUPPORTED, "ggml: cannot open %s (looked for %s, %s, %s in %s): %s", path,
                                LIBS[0], LIBS[1], LIBS[2], lib_dir, why ? why : "unknown error");
        }
    }
    return PI_OK;
}

static int fill_table(void *const h[N_LIBS], const char *lib_dir, pi_ggml_api *api) {
    const char *missing = NULL;
#define PI_GGML_BIND(ret, name, args)                                                     \
    if ((*(void **)&api->name = lookup(h, "ggml_" #name)) == NULL && missing == NULL) missing = "ggml_" #name;
    PI_GGML_FUNCS(PI_GGML_BIND)
#undef PI_GGML_BIND
    if (missing != NULL)
        return pi_set_error(PI_ERR_UNSUPPORTED, "ggml: symbol %s not found in %s/{%s, %s, %s}", missing, lib_dir,
                            LIBS[0], LIBS[1], LIBS[2]);
    return PI_OK;
}

static int bind_locked(const char *lib_dir, const char *min_v, const char *max_v, char *version_out, size_t n) {
    const long lo = parse_version(min_v), hi = parse_version(max_v);
    if (lo < 0 || hi < 0 || lo >= hi)
        return pi_set_error(PI_ERR_INVALID, "pi_ggml_bind: bad version range [%s, %s)", min_v, max_v);
    for (int i = 0; i < N_LIBS; i++) { /* first: a missing file names what was looked for, bound or not */
        char path[1200];
        snprintf(path, sizeof path, "%s/%s", lib_dir, LIBS[i]);
        if (access(path, R_OK) != 0)
            return pi_set_error(PI_ERR_UNSUPPORTED, "ggml: %s not found (looked for %s, %s, %s in %s)", path, LIBS[0],
                                LIBS[1], LIBS[2], lib_dir);
    }
    if (g_bound && strcmp(g_dir, lib_dir) != 0)
        return pi_set_error(PI_ERR_INVALID, "ggml is already bound to %s; cannot bind %s as well", g_dir, lib_dir);
    void *h[N_LIBS];
    int rc = open_libs(lib_dir, h);
    if (rc) return rc;
    pi_ggml_api api;
    rc = fill_table(h, lib_dir, &api);
    const char *version = rc == PI_OK ? api.version() : NULL;
    if (version != NULL && version_out != NULL && n > 0) snprintf(version_out, n, "%s", version);
    const long v = version != NULL ? parse_version(version) : -1;
    if (rc == PI_OK && (v < lo || v >= hi))
        rc = pi_set_error(PI_ERR_UNSUPPORTED, "ggml %s in %s is outside the supported range [%s, %s)", version, lib_dir,
                          min_v, max_v);
    if (rc || g_bound) { /* a failure, or a second bind of the same folder: keep one reference each */
        for (int i = 0; i < N_LIBS; i++) dlclose(h[i]);
        return rc;
    }
    g_api = api; /* the handles stay open for the process's life */
    snprintf(g_dir, sizeof g_dir, "%s", lib_dir);
    snprintf(g_version, sizeof g_version, "%s", version);
    __atomic_store_n(&g_bound, 1, __ATOMIC_RELEASE);
    return PI_OK;
}

int pi_ggml_bind(const char *lib_dir, const char *min_version, const char *max_version, char *version_out,
                 size_t n) {
    if (lib_dir == NULL || min_version == NULL || max_version == NULL)
        return pi_set_error(PI_ERR_INVALID, "pi_ggml_bind: NULL argument");
    if (strlen(lib_dir) >= sizeof g_dir)
        return pi_set_error(PI_ERR_INVALID, "pi_ggml_bind: lib_dir longer than %zu bytes", sizeof g_dir - 1);
    if (version_out != NULL && n > 0) version_out[0] = '\0';
    pthread_mutex_lock(&g_lock);
    const int rc = bind_locked(lib_dir, min_version, max_version, version_out, n);
    pthread_mutex_unlock(&g_lock);
    return rc;
}
