// aoti_runner: load an AOTInductor package (.pt2) with libtorch's AOTIModelPackageLoader, no Python involved, and
// time it. Built by engine/native/build.py (build_aoti_runner) against the libtorch inside the installed torch wheel.
//
//   aoti_runner --package model.pt2 --device cpu|cuda[:N] --input FILE:DTYPE:D0,D1,... [--input ...]
//               [--warmup 10] [--iters 100] [--output-dir DIR] [--model-name model]
//               [--device-lock FILE --timing-cores 0,1]
//
// Each --input is a raw, C-contiguous, little-endian tensor file (what numpy's tofile writes); DTYPE is one of
// float32 float64 float16 bfloat16 int64 int32. The runner loads the package, runs `warmup` untimed calls and
// `iters` timed ones (a host clock around each call, with a device synchronize on CUDA, so every sample is the full
// latency of one call), writes each output as DIR/output_<i>.bin, and prints one JSON object on stdout:
//
//   {"ok": true, "device": "cpu", "iters": 100, "warmup": 10, "load_us": ..., "samples_us": [...],
//    "peak_device_bytes": null | N, "max_rss_bytes": N,
//    "outputs": [{"path": ..., "dtype": "float32", "shape": [4, 1], "sum": ...}]}
//
// On an error it prints {"ok": false, "error": "..."} and exits with status 1. Diagnostics go to stderr.
//
// --device-lock: beside other runs of a group (engine/runner/device_lock.py) the runner holds the device itself, as a phased
// worker does: the lock file shared while it starts CUDA and loads the package, exclusive (on --timing-cores) while it
// warms up and times. Its caller gives the device up meanwhile, so others time while this one loads. Without it the
// caller holds the device for the runner.

#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/cuda.h>

#if MODELAB_TORCH_VERSION_MAJOR > 2 || (MODELAB_TORCH_VERSION_MAJOR == 2 && MODELAB_TORCH_VERSION_MINOR >= 9)
#include <c10/core/CachingDeviceAllocator.h>
#define MODELAB_HAS_DEVICE_ALLOCATOR_STATS 1
#else
#define MODELAB_HAS_DEVICE_ALLOCATOR_STATS 0
#endif

#include <fcntl.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct InputSpec {
  std::string path;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
};

struct Args {
  std::string package;
  std::string device = "cpu";
  std::string model_name = "model";
  std::string output_dir;
  std::vector<InputSpec> inputs;
  int warmup = 10;
  int iters = 100;
  std::string device_lock;  // engine.runner.device_lock's file for the device; empty: the caller holds the device
  std::vector<int> timing_cores;
};

[[noreturn]] void fail(const std::string& message) { throw std::runtime_error(message); }

std::string json_escape(const std::string& s) {
  std::ostringstream out;
  for (const unsigned char c : s) {
    switch (c) {
      case '"': out << "\\\""; break;
      case '\\': out << "\\\\"; break;
      case '\n': out << "\\n"; break;
      case '\r': out << "\\r"; break;
      case '\t': out << "\\t"; break;
      default:
        if (c < 0x20) {
          out << "\\u" << std::hex << std::setw(4) << std::setfill('0') << static_cast<int>(c) << std::dec;
        } else {
          out << c;
        }
    }
  }
  return out.str();
}

std::string json_number(double v) {
  if (!std::isfinite(v)) {
    return "null";
  }
  std::ostringstream out;
  out << std::setprecision(17) << v;
  return out.str();
}

at::ScalarType parse_dtype(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "float64") return at::kDouble;
  if (name == "float16") return at::kHalf;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "int64") return at::kLong;
  if (name == "int32") return at::kInt;
  fail("unsupported dtype '" + name + "' (float32 float64 float16 bfloat16 int64 int32)");
}

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    case at::kBool: return "bool";
    default: return c10::toString(t);
  }
}

InputSpec parse_input(const std::string& spec) {
  // FILE:DTYPE:D0,D1,...  (the file name may itself contain ':', so split from the right)
  const auto last = spec.rfind(':');
  const auto mid = last == std::string::npos || last == 0 ? std::string::npos : spec.rfind(':', last - 1);
  if (last == std::string::npos || mid == std::string::npos) {
    fail("--input wants FILE:DTYPE:D0,D1,..., got '" + spec + "'");
  }
  InputSpec in;
  in.path = spec.substr(0, mid);
  in.dtype = parse_dtype(spec.substr(mid + 1, last - mid - 1));
  std::stringstream dims(spec.substr(last + 1));
  std::string d;
  while (std::getline(dims, d, ',')) {
    if (d.empty()) continue;
    try {
      in.shape.push_back(std::stoll(d));
    } catch (const std::exception&) {
      fail("bad dimension '" + d + "' in --input " + spec);
    }
  }
  return in;
}

int parse_count(const std::string& flag, const std::string& value, int min) {
  try {
    const int v = std::stoi(value);
    if (v < min) fail(flag + " must be at least " + std::to_string(min));
    return v;
  } catch (const std::invalid_argument&) {
    fail(flag + " wants an integer, got '" + value + "'");
  }
}

std::vector<int> parse_cores(const std::string& value) {
  std::vector<int> cores;
  std::stringstream ss(value);
  for (std::string item; std::getline(ss, item, ',');) cores.push_back(parse_count("--timing-cores", item, 0));
  return cores;
}

// The device lock of a group (engine.runner.device_lock.PhaseHold, the same flock file): shared from construction,
// exclusive() for the timed part; the kernel drops it when the process ends, whatever the way. The lock's gate (the
// same path ending .gate: device_lock.gate_path) is held while waiting to take the device exclusively and passed
// while nobody holds it to take it shared, so a waiting timing goes before later preparations, as in device_lock.
class DeviceHold {
 public:
  explicit DeviceHold(const std::string& path) {
    if (path.empty()) return;
    fd_ = ::open(path.c_str(), O_CREAT | O_RDWR, 0666);
    if (fd_ < 0) fail("cannot open the device lock " + path);
    const std::string gate = gate_path(path);
    gate_ = ::open(gate.c_str(), O_CREAT | O_RDWR, 0666);
    if (gate_ < 0) fail("cannot open the device lock's gate " + gate);
    take(LOCK_SH);
  }
  ~DeviceHold() {
    if (fd_ < 0) return;
    if (exclusive_ && ::ftruncate(fd_, 0) != 0) std::cerr << "aoti_runner: could not clear the lock's label" << std::endl;
    ::close(fd_);  // and with it the lock
    ::close(gate_);
  }
  // Alone on the device, on the cores a timing holds (the caller synchronised the device first).
  void exclusive(const std::vector<int>& cores) {
    if (fd_ < 0) return;
    ::flock(fd_, LOCK_UN);
    take(LOCK_EX);
    exclusive_ = true;
    const std::string label = "pid " + std::to_string(::getpid()) + " (timing: aoti native runner)";
    if (::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, label.data(), label.size(), 0) < 0) {
      std::cerr << "aoti_runner: could not label the device lock" << std::endl;
    }
    if (!cores.empty()) {
      cpu_set_t set;
      CPU_ZERO(&set);
      for (int core : cores) CPU_SET(core, &set);
      if (::sched_setaffinity(0, sizeof(set), &set) != 0) {
        std::cerr << "aoti_runner: could not pin to the timing cores" << std::endl;
      }
    }
  }

 private:
  static std::string gate_path(const std::string& path) {
    const std::string suffix = ".lock";
    const bool ends =
        path.size() >= suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
    return (ends ? path.substr(0, path.size() - suffix.size()) : path) + ".gate";
  }
  static void lock(int fd, int kind) {
    while (::flock(fd, kind) != 0) {
      if (errno != EINTR) fail("cannot take the device lock");
    }
  }
  void take(int kind) {
    lock(gate_, kind == LOCK_EX ? LOCK_EX : LOCK_SH);  // exclusive: queue here; shared: only while nobody queues
    lock(fd_, kind);
    ::flock(gate_, LOCK_UN);
  }
  int fd_ = -1;
  int gate_ = -1;
  bool exclusive_ = false;
};

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::cerr << "usage: aoti_runner --package P.pt2 --device cpu|cuda[:N] --input FILE:DTYPE:D0,D1 [...]\n"
                   "                   [--warmup N] [--iters N] [--output-dir DIR] [--model-name NAME]\n"
                   "                   [--device-lock FILE --timing-cores 0,1]\n";
      std::exit(2);
    }
    if (i + 1 >= argc) fail("missing value after " + flag);
    const std::string value = argv[++i];
    if (flag == "--package") a.package = value;
    else if (flag == "--device") a.device = value;
    else if (flag == "--model-name") a.model_name = value;
    else if (flag == "--output-dir") a.output_dir = value;
    else if (flag == "--input") a.inputs.push_back(parse_input(value));
    else if (flag == "--warmup") a.warmup = parse_count(flag, value, 0);
    else if (flag == "--iters") a.iters = parse_count(flag, value, 1);
    else if (flag == "--device-lock") a.device_lock = value;
    else if (flag == "--timing-cores") a.timing_cores = parse_cores(value);
    else fail("unknown argument " + flag);
  }
  if (a.package.empty()) fail("--package is required");
  return a;
}

at::Tensor read_input(const InputSpec& in) {
  at::Tensor t = at::empty(in.shape, at::TensorOptions().dtype(in.dtype));
  const auto bytes = static_cast<std::streamsize>(t.numel() * t.element_size());
  std::ifstream f(in.path, std::ios::binary | std::ios::ate);
  if (!f) fail("cannot open input " + in.path);
  const std::streamsize size = f.tellg();
  if (size != bytes) {
    fail("input " + in.path + " has " + std::to_string(size) + " bytes; its dtype and shape need " +
         std::to_string(bytes));
  }
  f.seekg(0);
  f.read(static_cast<char*>(t.mutable_data_ptr()), bytes);
  if (!f) fail("could not read " + in.path);
  return t;
}

void write_output(const at::Tensor& t, const std::string& path) {
  const at::Tensor c = t.contiguous();
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) fail("cannot write " + path);
  f.write(static_cast<const char*>(c.const_data_ptr()), static_cast<std::streamsize>(c.numel() * c.element_size()));
  if (!f) fail("could not write " + path);
}

int64_t max_rss_bytes() {
  // This process's peak resident memory. VmHWM belongs to the process image; getrusage's ru_maxrss would carry the
  // parent's peak across fork + exec (a Python parent's hundreds of MB).
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      try {
        return std::stoll(line.substr(6)) * 1024;  // kB
      } catch (const std::exception&) {
        break;
      }
    }
  }
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

void sync(const c10::Device& device) {
  if (device.is_cuda()) {
    torch::cuda::synchronize(device.index());
  }
}

// Peak device memory comes from the caching allocator's statistics (what torch.cuda.max_memory_allocated reads).
// Memory statistics are a report, not the job: if this torch's allocator does not offer them, say null.
void reset_peak(const c10::Device& device) {
#if MODELAB_HAS_DEVICE_ALLOCATOR_STATS
  if (device.is_cuda()) {
    try {
      c10::getDeviceAllocator(c10::DeviceType::CUDA)->resetPeakStats(device.index());
    } catch (const std::exception& e) {
      std::cerr << "aoti_runner: cannot reset peak memory statistics: " << e.what() << std::endl;
    }
  }
#else
  (void)device;
#endif
}

int64_t peak_device_bytes(const c10::Device& device) {
#if MODELAB_HAS_DEVICE_ALLOCATOR_STATS
  if (device.is_cuda()) {
    try {
      const auto stats = c10::getDeviceAllocator(c10::DeviceType::CUDA)->getDeviceStats(device.index());
      return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
    } catch (const std::exception& e) {
      std::cerr << "aoti_runner: no peak memory statistics: " << e.what() << std::endl;
    }
  }
#else
  (void)device;
#endif
  return -1;
}

int run(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  DeviceHold hold(args.device_lock);  // shared from here: CUDA's start and the load happen beside other runs
  c10::Device device(args.device);
  if (device.is_cuda()) {
    if (!torch::cuda::is_available()) {
      fail("--device " + args.device + " but libtorch sees no CUDA device (is this a CPU-only torch?)");
    }
    if (!device.has_index()) device.set_index(0);
  } else if (!device.is_cpu()) {
    fail("--device must be cpu or cuda[:N], got " + args.device);
  }

  std::vector<at::Tensor> inputs;
  for (const auto& spec : args.inputs) {
    inputs.push_back(read_input(spec).to(device));
  }

  const auto load_start = std::chrono::steady_clock::now();
  // device_index: -1 lets a CPU package load; a CUDA package loads onto the given GPU.
  torch::inductor::AOTIModelPackageLoader loader(args.package, args.model_name, /*run_single_threaded=*/false,
                                                 /*num_runners=*/1,
                                                 device.is_cuda() ? device.index() : static_cast<c10::DeviceIndex>(-1));
  const double load_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - load_start).count();

  sync(device);
  hold.exclusive(args.timing_cores);
  reset_peak(device);
  std::vector<at::Tensor> outputs;
  for (int i = 0; i < args.warmup; ++i) {
    outputs = loader.run(inputs);
  }
  sync(device);
  std::vector<double> samples;
  samples.reserve(static_cast<size_t>(args.iters));
  for (int i = 0; i < args.iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    outputs = loader.run(inputs);
    sync(device);
    samples.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  const int64_t peak = peak_device_bytes(device);

  std::ostringstream json;
  json << "{\"ok\": true, \"device\": \"" << json_escape(device.str()) << "\", \"package\": \""
       << json_escape(args.package) << "\", \"iters\": " << args.iters << ", \"warmup\": " << args.warmup
       << ", \"load_us\": " << json_number(load_us) << ", \"samples_us\": [";
  for (size_t i = 0; i < samples.size(); ++i) {
    json << (i ? ", " : "") << json_number(samples[i]);
  }
  json << "], \"peak_device_bytes\": " << (peak >= 0 ? std::to_string(peak) : "null")
       << ", \"max_rss_bytes\": " << max_rss_bytes() << ", \"outputs\": [";
  for (size_t i = 0; i < outputs.size(); ++i) {
    const at::Tensor out = outputs[i].detach().to(at::kCPU);
    std::string path;
    if (!args.output_dir.empty()) {
      path = args.output_dir + "/output_" + std::to_string(i) + ".bin";
      write_output(out, path);
    }
    json << (i ? ", " : "") << "{\"path\": " << (path.empty() ? "null" : "\"" + json_escape(path) + "\"")
         << ", \"dtype\": \"" << dtype_name(out.scalar_type()) << "\", \"shape\": [";
    for (int64_t d = 0; d < out.dim(); ++d) {
      json << (d ? ", " : "") << out.size(d);
    }
    const double sum = out.is_floating_point() ? out.to(at::kDouble).sum().item<double>()
                                                                   : static_cast<double>(out.sum().item<int64_t>());
    json << "], \"sum\": " << json_number(sum) << "}";
  }
  json << "]}";
  std::cout << json.str() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    // c10::Error's what() carries a C++ backtrace; the first line is the message.
    std::string message = e.what();
    std::cerr << "aoti_runner: " << message << std::endl;
    const auto newline = message.find('\n');
    if (newline != std::string::npos) message = message.substr(0, newline);
    std::cout << "{\"ok\": false, \"error\": \"" << json_escape(message) << "\"}" << std::endl;
    return 1;
  }
}
