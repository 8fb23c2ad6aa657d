// The part of the PJRT C API (xla/pjrt/c/pjrt_c_api.h) this client calls, declared from its
// published layout at API version 0.81 rather than included, so the build needs no XLA or Python
// headers. Every argument struct starts with {struct_size, extension_start}; a plugin reads only
// the first struct_size bytes and rejects a struct smaller than its own, so these layouts must be
// at least as new as the plugins they drive (checked against the header xla-cpu-pjrt 0.0.1 ships).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tformers::backends::pjrt::capi {

// Opaque handles owned by the plugin.
struct PJRT_Error;
struct PJRT_Event;
struct PJRT_Client;
struct PJRT_Device;
struct PJRT_DeviceDescription;
struct PJRT_Buffer;
struct PJRT_Executable;
struct PJRT_LoadedExecutable;
struct PJRT_TopologyDescription;
struct PJRT_SerializedExecutable;
struct PJRT_Extension_Base;

// The version this file's layouts follow.
inline constexpr int kApiMajor = 0;
inline constexpr int kApiMinor = 81;
// 0.57 rearranged the PJRT_Api function table without a major bump: older plugins cannot be
// driven through these indices.
inline constexpr int kOldestApiMinor = 57;

struct PJRT_Api_Version {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  int major_version;
  int minor_version;
};

// The table GetPjrtApi returns: this header, then one function pointer per entry of Fn.
struct PJRT_Api {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Api_Version pjrt_api_version;
};
inline constexpr size_t kApiFunctionsOffset = 40;
static_assert(sizeof(PJRT_Api) == kApiFunctionsOffset);

// Positions in the function table (the order of pjrt_c_api.h's PJRT_Api fields).
#define TF_PJRT_FUNCTIONS(X)              \
  X(Error_Destroy, 0)                     \
  X(Error_Message, 1)                     \
  X(Error_GetCode, 2)                     \
  X(Plugin_Initialize, 3)                 \
  X(Plugin_Attributes, 4)                 \
  X(Event_Destroy, 5)                     \
  X(Event_Await, 8)                       \
  X(Client_Create, 10)                    \
  X(Client_Destroy, 11)                   \
  X(Client_PlatformName, 12)              \
  X(Client_PlatformVersion, 14)           \
  X(Client_AddressableDevices, 16)        \
  X(Client_Compile, 20)                   \
  X(Client_BufferFromHostBuffer, 22)      \
  X(DeviceDescription_Id, 23)             \
  X(DeviceDescription_Kind, 26)           \
  X(Device_GetDescription, 29)            \
  X(Executable_Destroy, 40)               \
  X(Executable_NumOutputs, 44)            \
  X(Executable_GetCostAnalysis, 46)       \
  X(Executable_Serialize, 49)             \
  X(LoadedExecutable_Destroy, 50)         \
  X(LoadedExecutable_GetExecutable, 51)   \
  X(LoadedExecutable_Execute, 55)         \
  X(Executable_DeserializeAndLoad, 56)    \
  X(Buffer_Destroy, 58)                   \
  X(Buffer_ElementType, 59)               \
  X(Buffer_Dimensions, 60)                \
  X(Buffer_IsDeleted, 68)                 \
  X(Buffer_ToHostBuffer, 70)              \
  X(TopologyDescription_Create, 82)       \
  X(TopologyDescription_Destroy, 83)      \
  X(TopologyDescription_PlatformName, 84) \
  X(Compile, 89)                          \
  X(Executable_GetCompiledMemoryStats, 96)

enum class Fn : int {
#define TF_PJRT_ENUM(name, index) name = index,
  TF_PJRT_FUNCTIONS(TF_PJRT_ENUM)
#undef TF_PJRT_ENUM
};

// "PJRT_Client_Compile" for Fn::Client_Compile.
inline const char* fn_name(Fn fn) {
  switch (fn) {
#define TF_PJRT_NAME(name, index) \
  case Fn::name:                  \
    return "PJRT_" #name;
    TF_PJRT_FUNCTIONS(TF_PJRT_NAME)
#undef TF_PJRT_NAME
  }
  return "PJRT_?";
}

enum PJRT_NamedValue_Type : int {
  PJRT_NamedValue_kString = 0,
  PJRT_NamedValue_kInt64 = 1,
  PJRT_NamedValue_kInt64List = 2,
  PJRT_NamedValue_kFloat = 3,
  PJRT_NamedValue_kBool = 4,
};

struct PJRT_NamedValue {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const char* name;
  size_t name_size;
  PJRT_NamedValue_Type type;
  union {
    const char* string_value;
    int64_t int64_value;
    const int64_t* int64_array_value;
    float float_value;
    bool bool_value;
  };
  size_t value_size;
};

struct PJRT_Error_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Error* error;
};

struct PJRT_Error_Message_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const PJRT_Error* error;
  const char* message;
  size_t message_size;
};

struct PJRT_Error_GetCode_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const PJRT_Error* error;
  int code;  // an absl::StatusCode
};

struct PJRT_Plugin_Initialize_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
};

struct PJRT_Plugin_Attributes_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const PJRT_NamedValue* attributes;
  size_t num_attributes;
};

struct PJRT_Event_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Event* event;
};

using PJRT_Event_Await_Args = PJRT_Event_Destroy_Args;

struct PJRT_Client_Create_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const PJRT_NamedValue* create_options;
  size_t num_options;
  void* kv_get_callback;
  void* kv_get_user_arg;
  void* kv_put_callback;
  void* kv_put_user_arg;
  PJRT_Client* client;
  void* kv_try_get_callback;
  void* kv_try_get_user_arg;
};

struct PJRT_Client_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
};

struct PJRT_Client_PlatformName_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  const char* platform_name;
  size_t platform_name_size;
};

struct PJRT_Client_PlatformVersion_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  const char* platform_version;
  size_t platform_version_size;
};

struct PJRT_Client_AddressableDevices_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  PJRT_Device* const* addressable_devices;
  size_t num_addressable_devices;
};

struct PJRT_Device_GetDescription_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Device* device;
  PJRT_DeviceDescription* device_description;
};

struct PJRT_DeviceDescription_Id_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_DeviceDescription* device_description;
  int id;
};

struct PJRT_DeviceDescription_Kind_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_DeviceDescription* device_description;
  const char* device_kind;
  size_t device_kind_size;
};

struct PJRT_Program {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  char* code;
  size_t code_size;
  const char* format;
  size_t format_size;
};

struct PJRT_Client_Compile_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  const PJRT_Program* program;
  const char* compile_options;
  size_t compile_options_size;
  PJRT_LoadedExecutable* executable;
};

struct PJRT_Client_BufferFromHostBuffer_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  const void* data;
  int type;  // PJRT_Buffer_Type
  const int64_t* dims;
  size_t num_dims;
  const int64_t* byte_strides;
  size_t num_byte_strides;
  int host_buffer_semantics;
  PJRT_Device* device;
  void* memory;
  void* device_layout;
  PJRT_Event* done_with_host_buffer;
  PJRT_Buffer* buffer;
};
// The host data is copied before BufferFromHostBuffer returns, so the caller may free it at once.
inline constexpr int kImmutableOnlyDuringCall = 0;

struct PJRT_Buffer_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
};

struct PJRT_Buffer_ElementType_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  int type;
};

struct PJRT_Buffer_Dimensions_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  const int64_t* dims;
  size_t num_dims;
};

struct PJRT_Buffer_IsDeleted_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  bool is_deleted;
};

struct PJRT_Buffer_ToHostBuffer_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* src;
  void* host_layout;
  void* dst;
  size_t dst_size;
  PJRT_Event* event;
};

struct PJRT_LoadedExecutable_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable;
};

struct PJRT_LoadedExecutable_GetExecutable_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* loaded_executable;
  PJRT_Executable* executable;
};

// The bytes live until serialized_executable_deleter is called on serialized_executable.
struct PJRT_Executable_Serialize_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const PJRT_Executable* executable;
  const char* serialized_bytes;
  size_t serialized_bytes_size;
  PJRT_SerializedExecutable* serialized_executable;
  void (*serialized_executable_deleter)(PJRT_SerializedExecutable*);
};

// Bytes from PJRT_Executable_Serialize of the same plugin build; null compile options keep the
// serialized executable's own.
struct PJRT_Executable_DeserializeAndLoad_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  const char* serialized_executable;
  size_t serialized_executable_size;
  PJRT_LoadedExecutable* loaded_executable;
  const char* overridden_serialized_compile_options;
  size_t overridden_serialized_compile_options_size;
};

struct PJRT_Executable_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
};

struct PJRT_Executable_NumOutputs_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  size_t num_outputs;
};

struct PJRT_ExecuteOptions {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  void* send_callbacks;
  void* recv_callbacks;
  size_t num_send_ops;
  size_t num_recv_ops;
  int launch_id;
  const int64_t* non_donatable_input_indices;
  size_t num_non_donatable_input_indices;
  void* context;
  const char* call_location;
  size_t num_tasks;
  int* task_ids;
  int64_t* incarnation_ids;
};

struct PJRT_LoadedExecutable_Execute_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable;
  PJRT_ExecuteOptions* options;
  PJRT_Buffer* const* const* argument_lists;
  size_t num_devices;
  size_t num_args;
  PJRT_Buffer** const* output_lists;
  PJRT_Event** device_complete_events;
  PJRT_Device* execute_device;
};

struct PJRT_Executable_GetCostAnalysis_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  size_t num_properties;
  const PJRT_NamedValue* properties;  // owned by the executable
};

struct PJRT_Executable_GetCompiledMemoryStats_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  // Device memory (HBM on TPUs and GPUs).
  int64_t generated_code_size_in_bytes;
  int64_t argument_size_in_bytes;
  int64_t output_size_in_bytes;
  int64_t alias_size_in_bytes;  // of the arguments, reused by outputs (donation)
  int64_t temp_size_in_bytes;
  // Host memory.
  int64_t host_generated_code_size_in_bytes;
  int64_t host_argument_size_in_bytes;
  int64_t host_output_size_in_bytes;
  int64_t host_alias_size_in_bytes;
  int64_t host_temp_size_in_bytes;
  int64_t peak_memory_in_bytes;
};

struct PJRT_TopologyDescription_Create_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const char* topology_name;
  size_t topology_name_size;
  const PJRT_NamedValue* create_options;
  size_t num_options;
  PJRT_TopologyDescription* topology;
};

struct PJRT_TopologyDescription_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_TopologyDescription* topology;
};

struct PJRT_TopologyDescription_PlatformName_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const PJRT_TopologyDescription* topology;
  const char* platform_name;
  size_t platform_name_size;
};

// Compilation for a topology, with no client: the executable is not loaded on any device.
struct PJRT_Compile_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const PJRT_TopologyDescription* topology;
  const PJRT_Program* program;
  const char* compile_options;
  size_t compile_options_size;
  PJRT_Client* client;  // optional
  PJRT_Executable* executable;
};

// The struct_size a plugin expects: the end of the last field, without tail padding (the
// header's PJRT_DEFINE_STRUCT_TRAITS).
template <typename Args>
struct LastField;
#define TF_PJRT_LAST_FIELD(Args, field)                                        \
  template <>                                                                  \
  struct LastField<Args> {                                                     \
    static constexpr size_t end = offsetof(Args, field) + sizeof(Args::field); \
  }
TF_PJRT_LAST_FIELD(PJRT_NamedValue, value_size);
TF_PJRT_LAST_FIELD(PJRT_Error_Destroy_Args, error);
TF_PJRT_LAST_FIELD(PJRT_Error_Message_Args, message_size);
TF_PJRT_LAST_FIELD(PJRT_Error_GetCode_Args, code);
TF_PJRT_LAST_FIELD(PJRT_Plugin_Initialize_Args, extension_start);
TF_PJRT_LAST_FIELD(PJRT_Plugin_Attributes_Args, num_attributes);
TF_PJRT_LAST_FIELD(PJRT_Event_Destroy_Args, event);
TF_PJRT_LAST_FIELD(PJRT_Client_Create_Args, kv_try_get_user_arg);
TF_PJRT_LAST_FIELD(PJRT_Client_Destroy_Args, client);
TF_PJRT_LAST_FIELD(PJRT_Client_PlatformName_Args, platform_name_size);
TF_PJRT_LAST_FIELD(PJRT_Client_PlatformVersion_Args, platform_version_size);
TF_PJRT_LAST_FIELD(PJRT_Client_AddressableDevices_Args, num_addressable_devices);
TF_PJRT_LAST_FIELD(PJRT_Device_GetDescription_Args, device_description);
TF_PJRT_LAST_FIELD(PJRT_DeviceDescription_Id_Args, id);
TF_PJRT_LAST_FIELD(PJRT_DeviceDescription_Kind_Args, device_kind_size);
TF_PJRT_LAST_FIELD(PJRT_Program, format_size);
TF_PJRT_LAST_FIELD(PJRT_Client_Compile_Args, executable);
TF_PJRT_LAST_FIELD(PJRT_Client_BufferFromHostBuffer_Args, buffer);
TF_PJRT_LAST_FIELD(PJRT_Buffer_Destroy_Args, buffer);
TF_PJRT_LAST_FIELD(PJRT_Buffer_ElementType_Args, type);
TF_PJRT_LAST_FIELD(PJRT_Buffer_Dimensions_Args, num_dims);
TF_PJRT_LAST_FIELD(PJRT_Buffer_IsDeleted_Args, is_deleted);
TF_PJRT_LAST_FIELD(PJRT_Buffer_ToHostBuffer_Args, event);
TF_PJRT_LAST_FIELD(PJRT_LoadedExecutable_Destroy_Args, executable);
TF_PJRT_LAST_FIELD(PJRT_LoadedExecutable_GetExecutable_Args, executable);
TF_PJRT_LAST_FIELD(PJRT_Executable_Destroy_Args, executable);
TF_PJRT_LAST_FIELD(PJRT_Executable_NumOutputs_Args, num_outputs);
TF_PJRT_LAST_FIELD(PJRT_Executable_Serialize_Args, serialized_executable_deleter);
TF_PJRT_LAST_FIELD(PJRT_Executable_DeserializeAndLoad_Args,
                   overridden_serialized_compile_options_size);
TF_PJRT_LAST_FIELD(PJRT_ExecuteOptions, incarnation_ids);
TF_PJRT_LAST_FIELD(PJRT_LoadedExecutable_Execute_Args, execute_device);
TF_PJRT_LAST_FIELD(PJRT_Executable_GetCostAnalysis_Args, properties);
TF_PJRT_LAST_FIELD(PJRT_Executable_GetCompiledMemoryStats_Args, peak_memory_in_bytes);
TF_PJRT_LAST_FIELD(PJRT_TopologyDescription_Create_Args, topology);
TF_PJRT_LAST_FIELD(PJRT_TopologyDescription_Destroy_Args, topology);
TF_PJRT_LAST_FIELD(PJRT_TopologyDescription_PlatformName_Args, platform_name_size);
TF_PJRT_LAST_FIELD(PJRT_Compile_Args, executable);
#undef TF_PJRT_LAST_FIELD

// A zeroed argument struct with its struct_size set.
template <typename Args>
Args make() {
  Args a{};
  a.struct_size = LastField<Args>::end;
  return a;
}

}  // namespace tformers::backends::pjrt::capi
