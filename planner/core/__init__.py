"""Shared ground every layer may use (bottom layer; imports nothing of fitplan's).

In: nothing of fitplan's. Out: the error hierarchy the CLI catches once (errors), byte units and
size parsing (units), atomic file writes (files), the table/JSON/YAML text helpers (render),
the schema helpers every YAML reader uses (schema), and the pinned llama.cpp tools' location
and loopback rpc-servers (llama_tools).
"""
