// Every CUDA driver and CUPTI call of libclusterprof_cupti goes through CuptiApi, so tests drive
// the recorder with a mock, and the real library is loaded at run time (LoadCuptiApi): a process
// without libcupti keeps running, with GPU tracing off and a message that says why.
#ifndef CLUSTERPROF_SDK_CUPTI_CUPTI_API_H_
#define CLUSTERPROF_SDK_CUPTI_CUPTI_API_H_

#include <cuda.h>
#include <cupti.h>

#include <cstdint>
#include <memory>
#include <string>

namespace clusterprof::cupti {

// Thread-safe as the CUPTI and driver functions behind it are.
class CuptiApi {
 public:
  virtual ~CuptiApi() = default;

  virtual CUptiResult GetVersion(uint32_t* version) = 0;
  virtual CUptiResult GetResultString(CUptiResult result, const char** text) = 0;
  virtual CUptiResult SetThreadIdType(CUpti_ActivityThreadIdType type) = 0;
  virtual CUptiResult ActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc request,
                                                CUpti_BuffersCallbackCompleteFunc complete) = 0;
  virtual CUptiResult ActivityEnable(CUpti_ActivityKind kind) = 0;
  virtual CUptiResult ActivityDisable(CUpti_ActivityKind kind) = 0;
  virtual CUptiResult ActivityFlushAll(uint32_t flag) = 0;
  virtual CUptiResult ActivityGetNextRecord(uint8_t* buffer, size_t valid_size,
                                            CUpti_Activity** record) = 0;
  virtual CUptiResult ActivityGetNumDroppedRecords(CUcontext context, uint32_t stream_id,
                                                   size_t* dropped) = 0;
  virtual CUptiResult GetTimestamp(uint64_t* timestamp) = 0;
  virtual CUptiResult GetCallbackName(CUpti_CallbackDomain domain, uint32_t cbid,
                                      const char** name) = 0;

  // The driver, for the device table (capability stats on the trace's GPU planes).
  virtual CUresult DeviceGetCount(int* count) = 0;
  virtual CUresult DeviceGet(CUdevice* device, int ordinal) = 0;
  virtual CUresult DeviceGetAttribute(int* value, CUdevice_attribute attribute,
                                      CUdevice device) = 0;
  virtual CUresult DeviceGetName(char* name, int length, CUdevice device) = 0;
  virtual CUresult DeviceTotalMem(size_t* bytes, CUdevice device) = 0;
  virtual CUresult DeviceGetUuid(CUuuid* uuid, CUdevice device) = 0;

  // The file libcupti was loaded from, as the dynamic loader found it ("" when unknown). Its name
  // tells CUDA 11.8's CUPTI (libcupti.so.11.8) from 12.0's and 12.1's, which report the same
  // API version.
  virtual std::string LibraryPath() const { return ""; }
};

// Loads libcupti and resolves the driver from the process (a CUDA process has it loaded). Looks
// for libcupti in $CLUSTERPROF_CUPTI_LIBRARY, then the library search path, then beside this
// library, then the CUDA toolkit's usual places. On failure returns nullptr and says what was
// tried in `error`.
// `path`, when not null, receives the file libcupti was loaded from.
std::unique_ptr<CuptiApi> LoadCuptiApi(std::string* error, std::string* path = nullptr);

}  // namespace clusterprof::cupti

#endif  // CLUSTERPROF_SDK_CUPTI_CUPTI_API_H_
