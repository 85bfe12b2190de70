"""stable-diffusion.cpp's runner graphs (UNet, FLUX.1 DiT, VAE, text encoders) built on runtime/ggml and
reserved by its graph allocator, for their compute buffers (beside runtime.engine, above runtime.ggml)."""
