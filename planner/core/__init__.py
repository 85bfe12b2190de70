"""Pure ground every layer may use (bottom layer; imports nothing of fitplan's, does no I/O).

In: nothing of fitplan's. Out: the error hierarchy the CLI catches once (errors), byte units and
size parsing (units), and the table/JSON/YAML text helpers (render).
"""
