"""stable-diffusion.cpp planning (`fitplan sd-fit`), following seed 002 (docs/backend.md); above planning.

In: sd-cli's `--backend` / `--params-backend` / `--max-vram` assignments, component files
(safetensors or GGUF headers), an inventory. Out: a placement per component and the sd-cli flags.

Pipeline: assign (flag syntax) -> resolve (device names) -> components (file headers) ->
sizing (family, modes, compute: each component's compute buffer at the image size, from the
sd-cli corpus) -> autofit | optimal (placement) -> split (layer/row ranges) -> check/traffic ->
plan (report, flags, verdict). sd_cli builds and runs the ground truth.
"""
