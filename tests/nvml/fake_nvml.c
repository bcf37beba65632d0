/*
 * A stand-in libnvidia-ml.so.1 for imexctl's tests (see README.md beside this file).
 *
 * It exports only the entry points that nvidia-ml-py and imexctl call to read
 * GPU fabric info, with nvml.h's struct layouts and return codes (NVIDIA/go-nvml
 * gen/nvml/nvml.h @ 2f9e261fe40a7a1c54783d66805e8920564763b4).  Everything else
 * is absent, so any other call fails in pynvml with FUNCTION_NOT_FOUND.
 *
 * Configuration: the file named by $FAKE_NVML_CONFIG, read at the first init,
 * "key = value" lines ('#' starts a comment line):
 *   behaviour = r580 | r570 | legacy-only   what nvmlDeviceGetGpuFabricInfoV accepts
 *   driver_version = 580.65.06               driver_version_error = <nvmlReturn_t>
 *   init_error = <nvmlReturn_t>              count = <GPUs>   count_error = <nvmlReturn_t>
 *   gpu.<i>.state = 3 | 1,2,3 (one per answer, the last repeats)
 *   gpu.<i>.status / .clique / .health_mask / .health_summary = <int>
 *   gpu.<i>.uuid = <32 hex digits, dashes allowed>
 *   gpu.<i>.error = <nvmlReturn_t of every fabric call>   gpu.<i>.handle_error = <nvmlReturn_t>
 * Build flags: -DFAKE_NVML_NO_V leaves out nvmlDeviceGetGpuFabricInfoV (a driver
 * without the versioned call), -DFAKE_NVML_NO_LEGACY leaves out nvmlDeviceGetGpuFabricInfo.
 *
 * Every call is appended to $FAKE_NVML_LOG (when set).  What the stand-in does
 * not know (a config key, a struct version, a foreign handle, a call before
 * init) is refused: an error code and one "fake_nvml: ..." line on stderr.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- nvml.h: types and constants used here ---- */
typedef enum nvmlReturn_enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

#define NVML_GPU_FABRIC_UUID_LEN 16
typedef unsigned char nvmlGpuFabricState_t;
typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct {
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    nvmlGpuFabricState_t state;
} nvmlGpuFabricInfo_t;

typedef struct {
    unsigned int version;
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    nvmlGpuFabricState_t state;
    unsigned int healthMask;
} nvmlGpuFabricInfo_v2_t;

typedef struct {
    unsigned int version;
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    nvmlGpuFabricState_t state;
    unsigned int healthMask;
    unsigned char healthSummary;
} nvmlGpuFabricInfo_v3_t;

#define NVML_STRUCT_VERSION(data, ver) (unsigned int)(sizeof(nvml##data##_v##ver##_t) | (ver << 24U))
#define nvmlGpuFabricInfo_v2 NVML_STRUCT_VERSION(GpuFabricInfo, 2)
#define nvmlGpuFabricInfo_v3 NVML_STRUCT_VERSION(GpuFabricInfo, 3)

/* the sizes imexctl's ctypes layouts assume (imexctl/gpu/nvml.py) */
_Static_assert(sizeof(nvmlGpuFabricInfo_t) == 28, "legacy struct size");
_Static_assert(sizeof(nvmlGpuFabricInfo_v2_t) == 36, "v2 struct size");
_Static_assert(sizeof(nvmlGpuFabricInfo_v3_t) == 40, "v3 struct size");
_Static_assert(nvmlGpuFabricInfo_v2 == 0x02000024, "v2 version");
_Static_assert(nvmlGpuFabricInfo_v3 == 0x03000028, "v3 version");
_Static_assert(offsetof(nvmlGpuFabricInfo_v3_t, healthSummary) == 36, "v3 healthSummary offset");

/* ---- the simulated machine ---- */
#define MAX_GPUS 16
#define MAX_STATES 16

struct nvmlDevice_st {
    int index, configured;
    int nstates;
    unsigned char states[MAX_STATES];
    int answers; /* successful fabric answers so far */
    int status, error, handle_error;
    unsigned int clique, health_mask;
    unsigned char health_summary;
    unsigned char uuid[NVML_GPU_FABRIC_UUID_LEN];
};

enum behaviour { R580, R570, LEGACY_ONLY };

static struct {
    int loaded, init_count;
    enum behaviour behaviour;
    char driver_version[80];
    int driver_version_error, init_error, count, count_error;
    struct nvmlDevice_st gpus[MAX_GPUS];
} sim;

static void trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void refuse(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void trace(const char *fmt, ...) {
    const char *path = getenv("FAKE_NVML_LOG");
    if (!path || !*path) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
    fclose(f);
}

static void refuse(const char *fmt, ...) {
    va_list ap;
    fputs("fake_nvml: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* ---- configuration ---- */
static int parse_int(const char *v, long *out) {
    char *end;
    if (!*v) return 0;
    *out = strtol(v, &end, 0);
    return *end == '\0';
}

static int parse_uuid(const char *v, unsigned char *out) {
    int n = 0;
    for (; *v; v++) {
        if (*v == '-') continue;
        char hex[3] = {v[0], v[1], 0};
        char *end;
        if (!v[1] || n >= NVML_GPU_FABRIC_UUID_LEN) return 0;
        out[n++] = (unsigned char)strtoul(hex, &end, 16);
        if (*end) return 0;
        v++;
    }
    return n == NVML_GPU_FABRIC_UUID_LEN;
}

static int parse_states(const char *v, struct nvmlDevice_st *g) {
    char buf[128];
    snprintf(buf, sizeof buf, "%s", v);
    g->nstates = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        long s;
        if (g->nstates >= MAX_STATES || !parse_int(tok, &s) || s < 0 || s > 255) return 0;
        g->states[g->nstates++] = (unsigned char)s;
    }
    return g->nstates > 0;
}

static int set_gpu(int i, const char *field, const char *v) {
    struct nvmlDevice_st *g = &sim.gpus[i];
    long n;
    g->configured = 1;
    if (!strcmp(field, "state")) return parse_states(v, g);
    if (!strcmp(field, "uuid")) return parse_uuid(v, g->uuid);
    if (!parse_int(v, &n)) return 0;
    if (!strcmp(field, "status")) g->status = (int)n;
    else if (!strcmp(field, "clique")) g->clique = (unsigned int)n;
    else if (!strcmp(field, "health_mask")) g->health_mask = (unsigned int)n;
    else if (!strcmp(field, "health_summary")) g->health_summary = (unsigned char)n;
    else if (!strcmp(field, "error")) g->error = (int)n;
    else if (!strcmp(field, "handle_error")) g->handle_error = (int)n;
    else return 0;
    return 1;
}

static int set_key(const char *k, const char *v) {
    long n;
    int i, used;
    char field[32];
    if (!strcmp(k, "behaviour")) {
        if (!strcmp(v, "r580")) sim.behaviour = R580;
        else if (!strcmp(v, "r570")) sim.behaviour = R570;
        else if (!strcmp(v, "legacy-only")) sim.behaviour = LEGACY_ONLY;
        else return 0;
        return 1;
    }
    if (!strcmp(k, "driver_version")) {
        snprintf(sim.driver_version, sizeof sim.driver_version, "%s", v);
        return 1;
    }
    if (sscanf(k, "gpu.%d.%31s%n", &i, field, &used) == 2 && k[used] == '\0')
        return i >= 0 && i < MAX_GPUS && set_gpu(i, field, v);
    if (!parse_int(v, &n)) return 0;
    if (!strcmp(k, "driver_version_error")) sim.driver_version_error = (int)n;
    else if (!strcmp(k, "init_error")) sim.init_error = (int)n;
    else if (!strcmp(k, "count_error")) sim.count_error = (int)n;
    else if (!strcmp(k, "count") && n >= 0 && n <= MAX_GPUS) sim.count = (int)n;
    else return 0;
    return 1;
}

static char *strip(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r')) *--e = '\0';
    return s;
}

static int load_config(void) {
    const char *path = getenv("FAKE_NVML_CONFIG");
    char line[256];
    int lineno = 0;
    memset(&sim, 0, sizeof sim);
    snprintf(sim.driver_version, sizeof sim.driver_version, "580.65.06");
    for (int i = 0; i < MAX_GPUS; i++) {
        sim.gpus[i].index = i;
        sim.gpus[i].nstates = 1;
        sim.gpus[i].states[0] = 3; /* COMPLETED */
    }
    if (!path) {
        refuse("FAKE_NVML_CONFIG is not set");
        return 0;
    }
    FILE *f = fopen(path, "r");
    if (!f) {
        refuse("cannot open config %s", path);
        return 0;
    }
    while (fgets(line, sizeof line, f)) {
        char *s = strip(line), *eq;
        lineno++;
        if (!*s || *s == '#') continue;
        eq = strchr(s, '=');
        if (eq) *eq = '\0';
        if (!eq || !set_key(strip(s), strip(eq + 1))) {
            refuse("%s:%d: unknown key or bad value: %s", path, lineno, s);
            fclose(f);
            return 0;
        }
    }
    fclose(f);
    for (int i = sim.count; i < MAX_GPUS; i++)
        if (sim.gpus[i].configured) {
            refuse("%s: gpu.%d is configured but count = %d", path, i, sim.count);
            return 0;
        }
    return 1;
}

/* ---- exported entry points ---- */
static int ready(const char *fn) {
    if (sim.init_count > 0) return 1;
    refuse("%s called before nvmlInitWithFlags", fn);
    return 0;
}

static struct nvmlDevice_st *ours(const char *fn, nvmlDevice_t device) {
    for (int i = 0; i < sim.count; i++)
        if (device == &sim.gpus[i]) return device;
    refuse("%s: unknown device handle %p", fn, (void *)device);
    return NULL;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    nvmlReturn_t rc = NVML_SUCCESS;
    if (flags != 0) {
        refuse("nvmlInitWithFlags: flags %#x not simulated", flags);
        rc = NVML_ERROR_INVALID_ARGUMENT;
    } else if (!sim.loaded && !(sim.loaded = load_config())) {
        rc = NVML_ERROR_UNKNOWN;
    } else if (sim.init_error) {
        rc = (nvmlReturn_t)sim.init_error;
    } else {
        sim.init_count++;
    }
    trace("nvmlInitWithFlags flags=%u -> %d", flags, rc);
    return rc;
}

nvmlReturn_t nvmlShutdown(void) {
    nvmlReturn_t rc = ready("nvmlShutdown") ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (rc == NVML_SUCCESS) sim.init_count--;
    trace("nvmlShutdown -> %d", rc);
    return rc;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch ((int)result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 7: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    case 13: return "Function Not Found";
    case 15: return "GPU is lost";
    case 25: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    nvmlReturn_t rc = NVML_SUCCESS;
    if (!ready("nvmlSystemGetDriverVersion")) rc = NVML_ERROR_UNINITIALIZED;
    else if (!version) rc = NVML_ERROR_INVALID_ARGUMENT;
    else if (sim.driver_version_error) rc = (nvmlReturn_t)sim.driver_version_error;
    else if (strlen(sim.driver_version) + 1 > length) rc = NVML_ERROR_INSUFFICIENT_SIZE;
    else strcpy(version, sim.driver_version);
    trace("nvmlSystemGetDriverVersion length=%u -> %d", length, rc);
    return rc;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    nvmlReturn_t rc = NVML_SUCCESS;
    if (!ready("nvmlDeviceGetCount_v2")) rc = NVML_ERROR_UNINITIALIZED;
    else if (!count) rc = NVML_ERROR_INVALID_ARGUMENT;
    else if (sim.count_error) rc = (nvmlReturn_t)sim.count_error;
    else *count = (unsigned int)sim.count;
    trace("nvmlDeviceGetCount_v2 -> %d", rc);
    return rc;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    nvmlReturn_t rc = NVML_SUCCESS;
    if (!ready("nvmlDeviceGetHandleByIndex_v2")) rc = NVML_ERROR_UNINITIALIZED;
    else if (!device || index >= (unsigned int)sim.count) {
        refuse("nvmlDeviceGetHandleByIndex_v2: bad index %u or NULL handle pointer", index);
        rc = NVML_ERROR_INVALID_ARGUMENT;
    } else if (sim.gpus[index].handle_error) rc = (nvmlReturn_t)sim.gpus[index].handle_error;
    else *device = &sim.gpus[index];
    trace("nvmlDeviceGetHandleByIndex_v2 index=%u -> %d", index, rc);
    return rc;
}

/* Fill the fields every layout shares; the answer's state advances through gpu.<i>.state. */
#define FILL_COMMON(info, g)                                                       \
    do {                                                                           \
        memcpy((info)->clusterUuid, (g)->uuid, NVML_GPU_FABRIC_UUID_LEN);          \
        (info)->status = (nvmlReturn_t)(g)->status;                                \
        (info)->cliqueId = (g)->clique;                                            \
        int k_ = (g)->answers < (g)->nstates ? (g)->answers : (g)->nstates - 1;    \
        (info)->state = (g)->states[k_];                                           \
        (g)->answers++;                                                            \
    } while (0)

__attribute__((unused)) static nvmlReturn_t fabric_precheck(const char *fn, nvmlDevice_t device, const void *info,
                                    struct nvmlDevice_st **g) {
    if (!ready(fn)) return NVML_ERROR_UNINITIALIZED;
    if (!(*g = ours(fn, device))) return NVML_ERROR_INVALID_ARGUMENT;
    if (!info) {
        refuse("%s: NULL info pointer", fn);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    return (nvmlReturn_t)(*g)->error;
}

#ifndef FAKE_NVML_NO_LEGACY
nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *info) {
    struct nvmlDevice_st *g = NULL;
    nvmlReturn_t rc = fabric_precheck("nvmlDeviceGetGpuFabricInfo", device, info, &g);
    if (rc == NVML_SUCCESS) FILL_COMMON(info, g);
    trace("nvmlDeviceGetGpuFabricInfo gpu=%d -> %d", g ? g->index : -1, rc);
    return rc;
}
#endif

#ifndef FAKE_NVML_NO_V
nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfo_v3_t *info) {
    struct nvmlDevice_st *g = NULL;
    unsigned int version = info ? info->version : 0;
    nvmlReturn_t rc = fabric_precheck("nvmlDeviceGetGpuFabricInfoV", device, info, &g);
    if (rc != NVML_SUCCESS) {
        /* refused above or a configured error */
    } else if (version != nvmlGpuFabricInfo_v2 && version != nvmlGpuFabricInfo_v3) {
        refuse("nvmlDeviceGetGpuFabricInfoV: unknown struct version %#x", version);
        rc = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    } else if (sim.behaviour == LEGACY_ONLY || (sim.behaviour == R570 && version == nvmlGpuFabricInfo_v3)) {
        rc = NVML_ERROR_ARGUMENT_VERSION_MISMATCH; /* a driver that does not know this version */
    } else if (version == nvmlGpuFabricInfo_v2) {
        nvmlGpuFabricInfo_v2_t *v2 = (nvmlGpuFabricInfo_v2_t *)info;
        FILL_COMMON(v2, g);
        v2->healthMask = g->health_mask;
    } else {
        FILL_COMMON(info, g);
        info->healthMask = g->health_mask;
        info->healthSummary = g->health_summary;
    }
    trace("nvmlDeviceGetGpuFabricInfoV gpu=%d version=%#x -> %d", g ? g->index : -1, version, rc);
    return rc;
}
#endif
