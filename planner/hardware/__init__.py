"""The devices a plan may use (above gguf; beside model).

In: detection (/proc, NVML, sysfs, llama-cli --list-devices), YAML inventories, `--device`
shorthands and the catalog. Out: an `Inventory` of `DeviceSpec`s and the host, in llama.cpp's
device order, and the per-device budgets of the `--max-vram` rules.
"""
