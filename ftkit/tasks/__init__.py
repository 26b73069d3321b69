"""Tasks for RL training: prompt datasets, reward plug-ins and the built-ins.

A *prompt dataset* yields ``PromptRecord`` s (text, optional label, ``file:line`` source) from a
file, streaming and strict: a malformed line is a ``ConfigError`` naming the file and line,
nothing is skipped (``jsonl``). ``batching`` turns prompts into token arrays whose shapes are
fixed by the config alone (left padding to a fixed maximum length, masks), so a micro-shard has
the same shapes whichever cell computes it (``sampling`` picks a rollout's prompts from the seed
and the rollout number alone); a tokenizer is used only through the small
``Tokenizer`` protocol (a Hugging Face tokenizer satisfies it; its chat template is applied where
it has one). A *reward* is any function with the keyword contract of ``protocols.RewardFn``,
loaded from ``module:function``, from the ``ftkit.rewards`` entry-point group or by a built-in
name (``rewards``, ``builtin_rewards``); scoring checks every value and names the plug-in and
sample of a failure, and a determinism check reports a plug-in whose scores move. ``data/``
ships ``arithmetic.jsonl``, generated word problems with exact answers (``datasets``). This
layer imports numpy only at module level (never torch or transformers); the built-in ``task``
and ``deterministic_random`` rewards reach the embedded addition task in ``ftkit.train``
lazily, inside the call (an upward arrow that ends when that task moves here).
"""
