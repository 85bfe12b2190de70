"""stable-diffusion.cpp planning (`fitplan sd-fit`), following seed 002 (docs/backend.md).

Pipeline: assign (flag syntax) -> resolve (device names) -> components (file headers) ->
autofit | optimal (placement) -> split (layer/row ranges) -> check/traffic -> plan (report, flags).
"""
