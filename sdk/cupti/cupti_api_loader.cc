#include <dlfcn.h>
#include <limits.h>

#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "sdk/cupti/cupti_api.h"

namespace clusterprof::cupti {
namespace {

// Resolves each function once; a missing symbol fails the load (an incompatible libcupti).
class DlCuptiApi final : public CuptiApi {
 public:
  std::string LibraryPath() const override { return library_path_; }
  void set_library_path(std::string path) { library_path_ = std::move(path); }

  static std::unique_ptr<DlCuptiApi> Load(void* cupti, void* driver, std::string* error) {
    auto api = std::unique_ptr<DlCuptiApi>(new DlCuptiApi());
    bool ok = true;
    auto resolve = [&](void* library, const char* name, auto& fn) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(library, name));
      if (fn == nullptr && ok) {
        ok = false;
        *error = std::string("symbol ") + name + " not found";
      }
    };
    resolve(cupti, "cuptiGetVersion", api->get_version_);
    resolve(cupti, "cuptiGetResultString", api->get_result_string_);
    resolve(cupti, "cuptiSetThreadIdType", api->set_thread_id_type_);
    resolve(cupti, "cuptiActivityRegisterCallbacks", api->register_callbacks_);
    resolve(cupti, "cuptiActivityEnable", api->enable_);
    resolve(cupti, "cuptiActivityDisable", api->disable_);
    resolve(cupti, "cuptiActivityFlushAll", api->flush_all_);
    resolve(cupti, "cuptiActivityGetNextRecord", api->get_next_record_);
    resolve(cupti, "cuptiActivityGetNumDroppedRecords", api->get_num_dropped_);
    resolve(cupti, "cuptiGetTimestamp", api->get_timestamp_);
    resolve(cupti, "cuptiGetCallbackName", api->get_callback_name_);
    resolve(driver, "cuDeviceGetCount", api->device_get_count_);
    resolve(driver, "cuDeviceGet", api->device_get_);
    resolve(driver, "cuDeviceGetAttribute", api->device_get_attribute_);
    resolve(driver, "cuDeviceGetName", api->device_get_name_);
    resolve(driver, "cuDeviceTotalMem_v2", api->device_total_mem_);
    resolve(driver, "cuDeviceGetUuid", api->device_get_uuid_);
    if (!ok) return nullptr;
    return api;
  }

  CUptiResult GetVersion(uint32_t* version) override { return get_version_(version); }
  CUptiResult GetResultString(CUptiResult result, const char** text) override {
    return get_result_string_(result, text);
  }
  CUptiResult SetThreadIdType(CUpti_ActivityThreadIdType type) override {
    return set_thread_id_type_(type);
  }
  CUptiResult ActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc request,
                                        CUpti_BuffersCallbackCompleteFunc complete) override {
    return register_callbacks_(request, complete);
  }
  CUptiResult ActivityEnable(CUpti_ActivityKind kind) override { return enable_(kind); }
  CUptiResult ActivityDisable(CUpti_ActivityKind kind) override { return disable_(kind); }
  CUptiResult ActivityFlushAll(uint32_t flag) override { return flush_all_(flag); }
  CUptiResult ActivityGetNextRecord(uint8_t* buffer, size_t valid_size,
                                    CUpti_Activity** record) override {
    return get_next_record_(buffer, valid_size, record);
  }
  CUptiResult ActivityGetNumDroppedRecords(CUcontext context, uint32_t stream_id,
                                           size_t* dropped) override {
    return get_num_dropped_(context, stream_id, dropped);
  }
  CUptiResult GetTimestamp(uint64_t* timestamp) override { return get_timestamp_(timestamp); }
  CUptiResult GetCallbackName(CUpti_CallbackDomain domain, uint32_t cbid,
                              const char** name) override {
    return get_callback_name_(domain, cbid, name);
  }
  CUresult DeviceGetCount(int* count) override { return device_get_count_(count); }
  CUresult DeviceGet(CUdevice* device, int ordinal) override {
    return device_get_(device, ordinal);
  }
  CUresult DeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice device) override {
    return device_get_attribute_(value, attribute, device);
  }
  CUresult DeviceGetName(char* name, int length, CUdevice device) override {
    return device_get_name_(name, length, device);
  }
  CUresult DeviceTotalMem(size_t* bytes, CUdevice device) override {
    return device_total_mem_(bytes, device);
  }
  CUresult DeviceGetUuid(CUuuid* uuid, CUdevice device) override {
    return device_get_uuid_(uuid, device);
  }

 private:
  std::string library_path_;
  DlCuptiApi() = default;

  CUptiResult (*get_version_)(uint32_t*) = nullptr;
  CUptiResult (*get_result_string_)(CUptiResult, const char**) = nullptr;
  CUptiResult (*set_thread_id_type_)(CUpti_ActivityThreadIdType) = nullptr;
  CUptiResult (*register_callbacks_)(CUpti_BuffersCallbackRequestFunc,
                                     CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*enable_)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*disable_)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*flush_all_)(uint32_t) = nullptr;
  CUptiResult (*get_next_record_)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
  CUptiResult (*get_num_dropped_)(CUcontext, uint32_t, size_t*) = nullptr;
  CUptiResult (*get_timestamp_)(uint64_t*) = nullptr;
  CUptiResult (*get_callback_name_)(CUpti_CallbackDomain, uint32_t, const char**) = nullptr;
  CUresult (*device_get_count_)(int*) = nullptr;
  CUresult (*device_get_)(CUdevice*, int) = nullptr;
  CUresult (*device_get_attribute_)(int*, CUdevice_attribute, CUdevice) = nullptr;
  CUresult (*device_get_name_)(char*, int, CUdevice) = nullptr;
  CUresult (*device_total_mem_)(size_t*, CUdevice) = nullptr;
  CUresult (*device_get_uuid_)(CUuuid*, CUdevice) = nullptr;
};

// The directory this library was loaded from (a deployment may put libcupti beside it).
std::string OwnDirectory() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&OwnDirectory), &info) == 0 || info.dli_fname == nullptr) {
    return "";
  }
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

}  // namespace

std::unique_ptr<CuptiApi> LoadCuptiApi(std::string* error, std::string* path) {
  std::vector<std::string> candidates;
  if (const char* path = std::getenv("CLUSTERPROF_CUPTI_LIBRARY"); path != nullptr && *path) {
    candidates.push_back(path);
  }
  candidates.push_back("libcupti.so");
  candidates.push_back("libcupti.so.13");
  candidates.push_back("libcupti.so.12");
  if (const std::string own = OwnDirectory(); !own.empty())
    candidates.push_back(own + "/libcupti.so");
  candidates.push_back("/usr/local/cuda/extras/CUPTI/lib64/libcupti.so");
  candidates.push_back("/usr/local/cuda/lib64/libcupti.so");

  void* cupti = nullptr;
  std::string tried;
  for (const std::string& candidate : candidates) {
    cupti = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (cupti != nullptr) break;
    const char* why = dlerror();
    tried += "\n  " + candidate + ": " + (why != nullptr ? why : "not found");
  }
  if (cupti == nullptr) {
    *error =
        "cannot load libcupti (it comes with the CUDA toolkit; set CLUSTERPROF_CUPTI_LIBRARY to "
        "its path, or put it beside libclusterprof_cupti.so). Tried:" +
        tried;
    return nullptr;
  }
  // The process's own driver: CUDA loaded it before calling InitializeInjection.
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (driver == nullptr) driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver == nullptr) {
    const char* why = dlerror();
    *error = std::string("cannot load the CUDA driver (libcuda.so.1): ") +
             (why != nullptr ? why : "not found");
    return nullptr;
  }
  std::string symbol_error;
  std::unique_ptr<DlCuptiApi> api = DlCuptiApi::Load(cupti, driver, &symbol_error);
  if (api == nullptr) {
    *error = "the libcupti or CUDA driver found is not usable (" + symbol_error +
             "); use the libcupti of CUDA 12 or newer";
    return nullptr;
  }
  Dl_info info;
  void* symbol = dlsym(cupti, "cuptiGetVersion");
  if (symbol != nullptr && dladdr(symbol, &info) != 0 && info.dli_fname != nullptr) {
    // The file itself, not the link that led to it: its name carries the CUDA version.
    char real[PATH_MAX];
    api->set_library_path(realpath(info.dli_fname, real) != nullptr ? real : info.dli_fname);
    if (path != nullptr) *path = info.dli_fname;
  }
  // The libraries stay loaded for the life of the process, as CUPTI requires.
  return api;
}

}  // namespace clusterprof::cupti
