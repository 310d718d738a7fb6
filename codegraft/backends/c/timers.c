
#include <time.h>
#define CG_KERNELS ${kernels}
static const char* const cg_kernel_names[${count}] = {${names}};
static const char* const cg_kernel_kinds[${count}] = {${kinds}};
static double cg_kernel_ns[${count}];
static int cg_timing;
static struct timespec cg_tick_last;
static inline void cg_tick_start(void) { if (cg_timing) clock_gettime(CLOCK_MONOTONIC, &cg_tick_last); }
static inline void cg_tick(int i) {
  if (!cg_timing) return;
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  cg_kernel_ns[i] += (double)(now.tv_sec - cg_tick_last.tv_sec) * 1e9 + (double)(now.tv_nsec - cg_tick_last.tv_nsec);
  cg_tick_last = now;
}
int cg_kernel_count(void) { return CG_KERNELS; }
const char* cg_kernel_name(int i) { return cg_kernel_names[i]; }
const char* cg_kernel_kind(int i) { return cg_kernel_kinds[i]; }
double cg_kernel_time_ns(int i) { return cg_kernel_ns[i]; }
void cg_set_timing(int on) { cg_timing = on; memset(cg_kernel_ns, 0, sizeof cg_kernel_ns); }
