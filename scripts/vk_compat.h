// fitplan: fills the gap of Debian 12's Vulkan 1.3.239 headers for the pinned ggml-vulkan.cpp
// (force-included into that file only; see scripts/build_llama_cpp.sh --vulkan).
//
// ggml-vulkan.cpp builds VK_EXT_layer_settings structures (ggml_vk_instance_init: the validation
// layer's validate_best_practices setting); the extension entered the headers in 1.3.275. The
// newer entry points it calls (vkGetPipelineExecutableStatisticsKHR, which Debian's loader does
// not export) need nothing here: ggml-vulkan-types.h sets VULKAN_HPP_DISPATCH_LOADER_DYNAMIC, so
// vulkan.hpp resolves them through vkGetInstanceProcAddr/vkGetDeviceProcAddr at run time and the
// link never names them.
#pragma once
#include <vulkan/vulkan_core.h>

#if VK_HEADER_VERSION < 275 && !defined(VK_EXT_layer_settings)
#define VK_EXT_layer_settings 1
typedef enum VkLayerSettingTypeEXT {
    VK_LAYER_SETTING_TYPE_BOOL32_EXT = 0, VK_LAYER_SETTING_TYPE_INT32_EXT = 1,
    VK_LAYER_SETTING_TYPE_INT64_EXT = 2, VK_LAYER_SETTING_TYPE_UINT32_EXT = 3,
    VK_LAYER_SETTING_TYPE_UINT64_EXT = 4, VK_LAYER_SETTING_TYPE_FLOAT32_EXT = 5,
    VK_LAYER_SETTING_TYPE_FLOAT64_EXT = 6, VK_LAYER_SETTING_TYPE_STRING_EXT = 7,
    VK_LAYER_SETTING_TYPE_MAX_ENUM_EXT = 0x7FFFFFFF
} VkLayerSettingTypeEXT;
typedef struct VkLayerSettingEXT {
    const char* pLayerName; const char* pSettingName; VkLayerSettingTypeEXT type;
    uint32_t valueCount; const void* pValues;
} VkLayerSettingEXT;
typedef struct VkLayerSettingsCreateInfoEXT {
    VkStructureType sType; const void* pNext; uint32_t settingCount; const VkLayerSettingEXT* pSettings;
} VkLayerSettingsCreateInfoEXT;

// The C++ spellings ggml-vulkan.cpp uses, layout-compatible with the C structs above.
#include <vector>
namespace vk {
enum class LayerSettingTypeEXT : int32_t { eBool32 = VK_LAYER_SETTING_TYPE_BOOL32_EXT };
struct LayerSettingEXT {
    const char* pLayerName; const char* pSettingName; LayerSettingTypeEXT type;
    uint32_t valueCount; const void* pValues;
};
struct LayerSettingsCreateInfoEXT {
    VkStructureType sType = static_cast<VkStructureType>(1000496000);  // ..._LAYER_SETTINGS_CREATE_INFO_EXT
    const void* pNext = nullptr;
    uint32_t settingCount;
    const LayerSettingEXT* pSettings;
    explicit LayerSettingsCreateInfoEXT(const std::vector<LayerSettingEXT>& s)
        : settingCount(static_cast<uint32_t>(s.size())), pSettings(s.data()) {}
};
}  // namespace vk
#endif
