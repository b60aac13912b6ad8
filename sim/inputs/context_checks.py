"""A scenario's requests against the context its engine serves (`engine.max_model_len`, else the
model's `ModelSpec.context_tokens`), refused at load as the engines refuse them: vLLM rejects a
max_model_len above the model's context (vllm/config/model.py `_get_and_verify_max_len`, unless
VLLM_ALLOW_LONG_MAX_MODEL_LEN), SGLang a context_length above it (unless
SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN), and each stops or refuses a request longer than the context
(vLLM: prompt + max_tokens above max_model_len is an error; unset, max_tokens is what is left of it).
Without `engine:` kvtier's own rules apply and no context is checked."""

from __future__ import annotations

from . import catalog
from .errors import ConfigError
from .lengths import draw_lengths
from .requests import build_requests


def longest_request_tokens(workload) -> int:
    """The longest prompt + output the workload draws: a closed batch's prompt + its longest reasoning,
    a served run's longest request (a trace's own lengths)."""
    if workload.arrivals is None:
        return int(workload.prompt_tokens) + int(draw_lengths(workload, workload.batch_size).max())
    reqs = build_requests(workload)
    return int((reqs.prompt_tokens + reqs.output_tokens).max())


def check_context(scenario, source: str) -> None:
    e = scenario.engine
    if e is None:
        return
    model = catalog.resolve_model(scenario.model)
    context = model.context_tokens
    if isinstance(e.max_model_len, int) and context is not None and e.max_model_len > context:
        raise ConfigError(f"{e.max_model_len:,} tokens is longer than {model.name}'s context of {context:,} "
                          f"(max_position_embeddings as rope scaling stretches it); {e.name} refuses it",
                          source=source, field="engine.max_model_len")
    declared = e.declared_context(context)
    if declared is None:
        return
    longest = longest_request_tokens(scenario.workload)
    if longest > declared:
        longer = ("a longer engine.max_model_len" if isinstance(e.max_model_len, int)
                  else "a config.json whose rope_scaling stretches it (model.hf_config)")
        raise ConfigError(f"the longest request holds {longest:,} tokens (prompt + output), more than the "
                          f"{declared:,} {e.name} serves ({e.context_origin(model.name)}), which it refuses or cuts "
                          f"short: give the lengths a max, or {longer}", source=source, field="workload.reasoning_tokens")
