// The first write to fresh anonymous memory by a new process started after the machine was idle
// for a while, on transparent huge pages (MADV_HUGEPAGE, as tessera's allocator maps large
// blocks) and on 4 KiB pages. Why: a cold start's first run writes every arena and output page
// for the first time (the gpt recipe at T = 512: ~31 MiB, 26 MiB of it on huge pages), and in a
// guest whose host hands back free memory (here a Firecracker VM with virtio-balloon free page
// reporting) that first write can cost far more than the kernel's zeroing. Each measurement
// waits the gap, then starts this program again as a child (`--child MB HUGE`), which times one
// write pass over a fresh block of MB MiB and a second pass over it (memory speed, no faults).
// Zen 4 guest, 16 MiB (benchmarks/results/2026-12-07-zen4-session41-changes.txt): huge pages
// 1.6-1.7 ms within 0.05 s of the last child, 19-52 ms after 5 s idle (the host faulting in
// pages it had taken back), alternating at 2 s; 4 KiB pages 8-12 ms at every gap. A process that
// sleeps and then writes memory it had unmapped measured no such cost.
//   bench_first_touch [--mb 16] [--gaps 0.05,1,2,5,10] [--reps 3]
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

constexpr size_t kHugePage = size_t{2} << 20;

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// A 2 MiB-aligned anonymous block of `bytes`, advised for huge pages if asked; null on failure.
char* map_block(size_t bytes, bool huge, void** raw, size_t* span) {
  *span = bytes + kHugePage;
  *raw = mmap(nullptr, *span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (*raw == MAP_FAILED) return nullptr;
  const uintptr_t base = reinterpret_cast<uintptr_t>(*raw);
  char* p = reinterpret_cast<char*>((base + kHugePage - 1) / kHugePage * kHugePage);
  if (huge) madvise(p, bytes, MADV_HUGEPAGE);
  return p;
}

std::vector<double> parse_list(const char* s) {
  std::vector<double> v;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    v.push_back(std::strtod(p, &end));
    if (end == p) break;
    p = *end == ',' ? end + 1 : end;
  }
  return v;
}

// The child: one fresh block, first and second write pass in ms on stdout.
int child(size_t mb, bool huge) {
  const size_t bytes = mb << 20;
  void* raw = nullptr;
  size_t span = 0;
  char* p = map_block(bytes, huge, &raw, &span);
  if (p == nullptr) return 1;
  auto t0 = std::chrono::steady_clock::now();
  std::memset(p, 1, bytes);
  const double first = ms_since(t0);
  t0 = std::chrono::steady_clock::now();
  std::memset(p, 2, bytes);
  const double second = ms_since(t0);
  std::printf("%.2f %.2f\n", first, second);
  return 0;
}

// Runs the child, returns its (first, second) pass in ms, or (-1, -1).
std::pair<double, double> run_child(size_t mb, bool huge) {
  int fds[2];
  if (pipe(fds) != 0) return {-1, -1};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  const std::string mb_text = std::to_string(mb);
  char self[] = "/proc/self/exe", flag[] = "--child", huge_text[] = "1", small_text[] = "0";
  std::vector<char> mb_arg(mb_text.begin(), mb_text.end());
  mb_arg.push_back('\0');
  char* args[] = {self, flag, mb_arg.data(), huge ? huge_text : small_text, nullptr};
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, self, &actions, nullptr, args, environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  std::pair<double, double> t{-1, -1};
  if (rc == 0) {
    char buf[64] = {};
    const ssize_t n = read(fds[0], buf, sizeof buf - 1);
    if (n > 0 && std::sscanf(buf, "%lf %lf", &t.first, &t.second) != 2) t = {-1, -1};
    int status = 0;
    waitpid(pid, &status, 0);
  }
  close(fds[0]);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--child")
    return child(std::strtoull(argv[2], nullptr, 10), std::atoi(argv[3]) != 0);
  size_t mb = 16;
  int reps = 3;
  std::vector<double> gaps = {0.05, 1, 2, 5, 10};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--mb") {
      mb = std::strtoull(argv[i + 1], nullptr, 10);
    } else if (a == "--gaps") {
      gaps = parse_list(argv[i + 1]);
    } else if (a == "--reps") {
      reps = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "usage: %s [--mb N] [--gaps S,S,...] [--reps R]\n", argv[0]);
      return 2;
    }
  }
  if (mb == 0 || mb > (size_t{1} << 20) || reps <= 0 || gaps.empty()) {
    std::fprintf(stderr, "--mb (1 .. 2^20), --reps and --gaps must be positive\n");
    return 2;
  }
  std::printf("a new process's first write to %zu MiB of fresh anonymous memory after an idle "
              "gap; ms per pass (second pass: same block, no faults)\n", mb);
  std::printf("%8s %6s   %-30s %s\n", "gap s", "pages", "first write ms", "second pass ms");
  for (const double gap : gaps) {
    for (const bool huge : {true, false}) {
      std::string first, second;
      for (int r = 0; r < reps; ++r) {
        std::this_thread::sleep_for(std::chrono::duration<double>(gap));
        const auto [t1, t2] = run_child(mb, huge);
        char buf[32];
        std::snprintf(buf, sizeof buf, " %.2f", t1);
        first += buf;
        std::snprintf(buf, sizeof buf, " %.2f", t2);
        second += buf;
      }
      std::printf("%8.2f %6s   %-30s %s\n", gap, huge ? "huge" : "4 KiB", first.c_str(),
                  second.c_str());
    }
  }
  return 0;
}
