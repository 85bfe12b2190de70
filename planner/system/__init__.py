"""This machine and the network (above core).

In: paths, URLs, ports. Out: atomic and bounded file reads and writes (files), the schema helpers every
YAML reader uses (schema), HTTP with retries (http), ports and addresses (net), the pinned llama.cpp
tools' location and build, and loopback rpc-servers (llama_tools).
"""
