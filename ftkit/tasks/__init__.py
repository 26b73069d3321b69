"""Tasks for RL training: the task contract, prompt datasets, reward plug-ins and the built-ins.

A *task* is what training asks of one (``protocols.RlTask``: fixed prompt and response
lengths, the prompts of a rollout from the seed and the rollout number, the held-out set, the
right answers, the learned-token mask, the sample a reward sees). Two implement it: the
built-in token-level addition task (``addition``: a synthetic vocabulary or a model's
tokenizer, ``task_for``) and a prompt dataset read through a model's tokenizer
(``prompt_task``). A *prompt dataset* yields ``PromptRecord`` s (text, optional label,
``file:line`` source) from a file, streaming and strict: a malformed line is a ``ConfigError``
naming the file and line, nothing is skipped (``jsonl``). ``batching`` turns prompts into token
arrays whose shapes are fixed by the config alone (left padding to a fixed maximum length,
masks), so a micro-shard has the same shapes whichever cell computes it (``sampling`` picks a
rollout's prompts from the seed and the rollout number alone); a tokenizer is used only
through the small ``Tokenizer`` protocol (a Hugging Face tokenizer satisfies it, loaded by
``tokenizer.load_tokenizer``; its chat template is applied where it has one). A *reward* is
any function with the keyword contract of ``protocols.RewardFn``, loaded from
``module:function``, from the ``ftkit.rewards`` entry-point group or by a built-in name
(``rewards``; the one registry of built-ins is ``builtin_rewards.BUILTINS``); scoring checks
every value and names the plug-in and sample of a failure, and a determinism check reports a
plug-in whose scores move. ``data/`` ships ``arithmetic.jsonl``, generated word problems with
exact answers (``datasets``). This layer imports numpy only at module level (torch and
transformers inside functions) and nothing of ``ftkit.train``.
"""
