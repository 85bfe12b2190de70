"""mamba (Mamba-1, Falcon-Mamba) and mamba2 (Mamba-2, Codestral Mamba): every block one mixer over the
recurrent memory alone (no attention cache), node for node as src/models/mamba.cpp's graph builds them
at the pinned build (src/models/mamba2.cpp reuses it): runtime/engine/recurrent.py's Mamba1 for mamba
(Falcon-Mamba's ssm.dt_b_c_rms RMS-normalises dt, B and C without weights), its Mamba2 (the mixer
granitehybrid and nemotron_h use) for mamba2.

Graph order: the token embeddings, the recurrent memory's input (build_rs_inp: rs_s_copy), out_ids;
per block the input norm, the mixer, in the last block the output rows of the mixer and of its input,
the residual; the output norm and the output matrix.
"""
from __future__ import annotations

from collections.abc import Mapping

from gguf import MODEL_TENSOR as T
from gguf import Keys

from planner.gguf.reader import ModelFile
from planner.model.tensors import OUTPUT, OUTPUT_NORM, TOKEN_EMBD, tensor_name
from runtime.engine.builder import BatchShape, BuiltGraph, DecoderBuilder
from runtime.engine.hparams import HParams
from runtime.engine.kvcache import KVCache
from runtime.engine.recurrent import (
    Mamba1,
    Mamba2,
    RecurrentStates,
    RsInputs,
    read_mamba1_params,
    read_ssm_params,
    token_embeddings,
    ubatch_sequences,
)
from runtime.ggml import build as B
from runtime.ggml.graph import Tensor

MAMBA = "mamba"
MAMBA2 = "mamba2"


class MambaBuilder(DecoderBuilder):
    def __init__(self, model: ModelFile, hp: HParams, weights: Mapping[str, Tensor], kv: KVCache,
                 states: RecurrentStates, *, flash_attn: bool, offload_kqv: bool) -> None:
        super().__init__(hp, weights, kv, flash_attn=flash_attn, offload_kqv=offload_kqv)
        self.states = states
        self.model = model

    def _mixer(self, rs: RsInputs) -> Mamba1 | Mamba2:
        g = self.out.graph
        if self.hp.arch == MAMBA2:
            return Mamba2(read_ssm_params(self.model), self._need, self._w, self.norm, g, rs, self.states, self.lora)
        d_conv, d_inner, d_state, dt_rank = read_mamba1_params(self.model)
        dt_b_c_rms = bool(self.model.metadata.get(Keys.SSM.DT_B_C_RMS.format(arch=MAMBA), False))
        return Mamba1(d_conv, d_inner, d_state, dt_rank, self._need, self._w, self.norm, g, rs, self.states,
                      self.lora, self.hp.eps if dt_b_c_rms else 0.0)

    def build(self, shape: BatchShape) -> BuiltGraph:
        hp = self.hp
        self._inputs(shape)
        g = self.out.graph
        n_seqs = ubatch_sequences(self.states, shape.n_tokens)
        mixer = self._mixer(RsInputs.reserve(self.states, n_seqs))
        x = token_embeddings(g, self._need(TOKEN_EMBD), self.out.tokens, self.out.embd, "inp_embd_rows", self.lora)
        for il in range(hp.n_layer):
            cur = mixer(self.norm(x, tensor_name(T.ATTN_NORM, il), il), il, n_seqs)
            if il == hp.n_layer - 1:  # keep only the rows that produce outputs
                cur = B.get_rows(cur, self.out.out_ids)
                x = B.get_rows(x, self.out.out_ids)
            x = B.add(cur, x, name=f"l_out-{il}")
        cur = self.norm(x, OUTPUT_NORM, -1)
        out_w = self._w(OUTPUT) or self._need(TOKEN_EMBD)
        cur = self.lora.mm(out_w, cur, name="result_output")
        g.expand(cur)
        self.out.logits = cur
        return self.out
