"""llama-server's prompt batching (planner.running.tool_runs.server_prompt_batches): for a model with a
sliding window it stops a batch 4 + n_ubatch and 4 tokens before the prompt's end so it can
checkpoint the window cache (server-context.cpp, checkpoint_offsets), and no batch passes n_batch."""
from planner.running.tool_runs import server_prompt_batches


def test_short_prompt_keeps_its_last_four_tokens_apart() -> None:
    assert server_prompt_batches(6, checkpoints=True) == [2, 4]
    assert server_prompt_batches(19, checkpoints=True) == [15, 4]


def test_four_tokens_or_fewer_are_one_batch() -> None:
    assert server_prompt_batches(4, checkpoints=True) == [4]
    assert server_prompt_batches(3, checkpoints=True) == [3]


def test_long_prompt_also_breaks_an_ubatch_plus_four_before_the_end() -> None:
    # 600 tokens, n_ubatch 512: breaks at 600 - 516 = 84 and at 596
    assert server_prompt_batches(600, checkpoints=True, n_batch=1024) == [84, 512, 4]


def test_without_checkpoints_only_n_batch_splits() -> None:
    assert server_prompt_batches(600, checkpoints=False, n_batch=1024) == [600]
    assert server_prompt_batches(3000, checkpoints=False, n_batch=1024) == [1024, 1024, 952]


def test_batches_never_pass_n_batch() -> None:
    # 3000 tokens, n_batch 2048: [0, 2048) then up to the break at 2484, then 512, then 4
    assert server_prompt_batches(3000, checkpoints=True) == [2048, 436, 512, 4]
