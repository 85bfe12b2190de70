"""stable-diffusion.cpp planning (`fitplan sd-fit`), following seed 002 (docs/backend.md); above planning.

In: sd-cli's `--backend` / `--params-backend` / `--max-vram` assignments, component files
(safetensors or GGUF headers), an inventory. Out: a placement per component and the sd-cli flags.

Pipeline: assign (flag syntax) -> resolve (device names) -> components (file headers) ->
autofit | optimal (placement) -> split (layer/row ranges) -> check/traffic -> plan (report, flags).
"""
