// hide_avx512: an LD_PRELOAD module that makes this process's CPUID report an AVX2 CPU (no
// AVX-512, no AVX10, no AMX), so that a peer runtime dispatching on CPUID runs the kernels it
// runs on an AVX2 desktop. Issue 15 compares tessera's AVX2 path with ONNX Runtime's and
// PyTorch's; tessera's is forced by TESSERA_HWY_TARGET, theirs has no such switch (ONNX
// Runtime's MLAS reads CPUID and XCR0 itself), and the only AVX2-only CPU seen here so far was a
// Zen 3 that is rarely given. benchmarks/models.py and peers.py start their peers under this
// module when --target AVX2 runs on an AVX-512 machine (--peer-isa).
//
// How: Linux's arch_prctl(ARCH_SET_CPUID, 0) makes the CPUID instruction fault in this thread
// and in every thread and child it creates until execve (CPU "cpuid_fault" flag, emulated by KVM
// for its guests). The SIGSEGV handler below recognises the instruction (0F A2), lets it through
// for one execution with the faulting turned off, clears the feature bits and steps over it.
// XGETBV cannot be intercepted: XCR0 still enables the AVX-512 state, which no detector uses
// without the CPUID bits. What does not reach CPUID (glibc's own ifunc choices, made before any
// constructor runs) keeps the real CPU's view; string and libm routines are not what is timed.
//
// The handler has to stay first: node installs its own SIGSEGV handler at start-up and, for a
// fault that is not WebAssembly's, crashes instead of calling the one it replaced. So this
// module also defines sigaction() and signal() for SIGSEGV: the program's handler is kept here
// (what it installs, and what it reads back) and gets every SIGSEGV that is not a CPUID.
// Outside x86-64 Linux this module builds to nothing.
#if defined(__x86_64__) && defined(__linux__)
#include <asm/prctl.h>
#include <cpuid.h>
#include <dlfcn.h>
#include <signal.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>

namespace {

using SigactionFn = int (*)(int, const struct sigaction*, struct sigaction*);

// libc's sigaction, under the one this module defines.
SigactionFn real_sigaction() {
  static const auto fn = reinterpret_cast<SigactionFn>(dlsym(RTLD_NEXT, "sigaction"));
  return fn;
}

bool installed = false;
// The SIGSEGV disposition the program believes it has: the one before this module, then
// whatever it installs.
struct sigaction program_action;

// Leaf 7 subleaf 0 (Intel SDM vol. 2A, CPUID): EBX AVX512F 16, DQ 17, IFMA 21, PF 26, ER 27,
// CD 28, BW 30, VL 31; ECX VBMI 1, VBMI2 6, VNNI 11, BITALG 12, VPOPCNTDQ 14; EDX 4VNNIW 2,
// 4FMAPS 3, VP2INTERSECT 8, AMX-BF16 22, AVX512_FP16 23, AMX-TILE 24, AMX-INT8 25.
// Subleaf 1: EAX AVX512_BF16 5; EDX AVX10 19. AVX, FMA, AVX2, F16C, AVX-VNNI, GFNI, VAES and
// VPCLMULQDQ stay: AVX2 desktops of the same generation have them.
constexpr uint32_t kLeaf7Ebx = (1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) |
                               (1u << 28) | (1u << 30) | (1u << 31);
constexpr uint32_t kLeaf7Ecx = (1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14);
constexpr uint32_t kLeaf7Edx =
    (1u << 2) | (1u << 3) | (1u << 8) | (1u << 22) | (1u << 23) | (1u << 24) | (1u << 25);
constexpr uint32_t kLeaf7Sub1Eax = 1u << 5;
constexpr uint32_t kLeaf7Sub1Edx = 1u << 19;

bool set_cpuid_faulting(bool on) {
  return syscall(SYS_arch_prctl, ARCH_SET_CPUID, on ? 0 : 1) == 0;
}

void on_segv(int sig, siginfo_t* info, void* context) {
  auto* uc = static_cast<ucontext_t*>(context);
  greg_t* regs = uc->uc_mcontext.gregs;
  const auto* ip = reinterpret_cast<const unsigned char*>(regs[REG_RIP]);
  if (info->si_code == SI_KERNEL && ip[0] == 0x0F && ip[1] == 0xA2) {
    const uint32_t leaf = static_cast<uint32_t>(regs[REG_RAX]);
    const uint32_t subleaf = static_cast<uint32_t>(regs[REG_RCX]);
    uint32_t a = 0, b = 0, c = 0, d = 0;
    set_cpuid_faulting(false);
    __cpuid_count(leaf, subleaf, a, b, c, d);
    set_cpuid_faulting(true);
    if (leaf == 7 && subleaf == 0) {
      b &= ~kLeaf7Ebx;
      c &= ~kLeaf7Ecx;
      d &= ~kLeaf7Edx;
    } else if (leaf == 7 && subleaf == 1) {
      a &= ~kLeaf7Sub1Eax;
      d &= ~kLeaf7Sub1Edx;
    } else if (leaf == 0x24) {  // the AVX10 leaf: nothing to report without its bit
      a = b = c = d = 0;
    }
    regs[REG_RAX] = a;
    regs[REG_RBX] = b;
    regs[REG_RCX] = c;
    regs[REG_RDX] = d;
    regs[REG_RIP] += 2;
    return;
  }
  if ((program_action.sa_flags & SA_SIGINFO) && program_action.sa_sigaction != nullptr) {
    program_action.sa_sigaction(sig, info, context);
  } else if (!(program_action.sa_flags & SA_SIGINFO) && program_action.sa_handler != SIG_DFL &&
             program_action.sa_handler != SIG_IGN) {
    program_action.sa_handler(sig);
  } else {
    // The faulting instruction runs again and takes the default action.
    struct sigaction fallback = {};
    fallback.sa_handler = SIG_DFL;
    real_sigaction()(SIGSEGV, &fallback, nullptr);
  }
}

__attribute__((constructor)) void hide_avx512() {
  struct sigaction action = {};
  action.sa_sigaction = on_segv;
  // SA_ONSTACK: a program's alternate stack (stack-overflow reports) serves this handler too.
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  if (real_sigaction() == nullptr || real_sigaction()(SIGSEGV, &action, &program_action) != 0 ||
      !set_cpuid_faulting(true)) {
    // Better no process than one that silently measures the AVX-512 path.
    std::fprintf(stderr, "hide_avx512: CPUID faulting unavailable here (arch_prctl)\n");
    _exit(70);
  }
  installed = true;
}

}  // namespace

extern "C" int sigaction(int sig, const struct sigaction* act, struct sigaction* old) {
  if (sig != SIGSEGV || !installed) return real_sigaction()(sig, act, old);
  if (old != nullptr) *old = program_action;
  if (act != nullptr) program_action = *act;
  return 0;
}

extern "C" sighandler_t signal(int sig, sighandler_t handler) {
  struct sigaction act = {}, old = {};
  act.sa_handler = handler;
  act.sa_flags = SA_RESTART;
  sigemptyset(&act.sa_mask);
  if (sigaction(sig, &act, &old) != 0) return SIG_ERR;
  return old.sa_handler;
}
#endif
