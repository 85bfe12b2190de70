"""The model files the model-set tests plan together: the bundled Gemma 3 270M (a chat model), a small
gemma3 chat model sharing its vocabulary, and a tiny BERT encoder (an embedding model)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from planner.gguf.reader import read_model
from planner.registry.examples import resolve_model
from planner.synth.draft_models import write_drafter
from planner.synth.shapes_embed import BERT, tiny_bert


@dataclass(frozen=True)
class SetFiles:
    gemma: str   # the bundled file
    small: str   # written into the directory
    embed: str   # written into the directory

    def resident(self) -> dict[str, dict]:
        """The set file's two always-resident entries: the chat model (first by priority) and the encoder."""
        return {"chat": {"model": self.gemma, "ctx": 2048, "resident": "always", "priority": 10},
                "embed": {"model": self.embed, "role": "embedding", "ctx": 512, "resident": "always"}}


def set_files(directory: Path) -> SetFiles:
    """Write the small chat model and the encoder into `directory`; their paths with the bundled Gemma's."""
    gemma = resolve_model("example:gemma3-270m")
    small = write_drafter(directory / "small.gguf", read_model(gemma))
    embed = directory / "embed.gguf"
    tiny_bert(BERT).write(embed)
    return SetFiles(gemma, str(small), str(embed))
