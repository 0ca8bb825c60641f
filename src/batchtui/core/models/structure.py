"""What a causal LM is made of, found by watching it run: never by its architecture's module names.

One small probe pass at load, with hooks on every module, tells for any `PreTrainedModel`:
- the decoder layers (the ModuleList whose items run once each, as many as the config's layers),
- each layer's sub-modules in the order they run (attention, norms, MLP... by their real dotted names),
- the modules that run after the last layer and before the output head (the final norm),
- MoE routers (a module inside a layer whose output scores each token over the experts),
- whether the model is causal: changing the last token must leave earlier positions alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..compat.transformers import module_output

# Roles: a short label shown beside a module's name, only where the module says what it is.
ATTENTION, MLP, NORM, ROUTER = "attention", "MLP", "norm", "router"


@dataclass(frozen=True)
class Module:
    """One recorded module: its dotted name, its kind in the model and, where known, its role."""

    name: str
    kind: str  # "embedding", "layer" (a decoder layer's output), "sub" (inside a layer), "final"
    role: str | None = None
    layer: int | None = None  # the decoder layer it belongs to


@dataclass(frozen=True)
class Structure:
    embedding: str  # the input embeddings' dotted name
    layers: tuple[str, ...]  # decoder layers, in order
    subs: tuple[tuple[str, ...], ...]  # per layer: its sub-modules, in the order they run
    roles: dict[str, str]  # dotted name -> role, where known
    final: tuple[str, ...]  # modules after the last layer, before the head (the final norm)
    routers: tuple[tuple[int, str], ...]  # (layer, dotted name) of each MoE router, in run order
    experts_per_token: int | None  # how many experts each token is routed to
    causal: bool
    finite: bool  # the probe's logits hold no NaN or inf (where they do, "causal" False may be NaN's doing)

    def recorded(self, modules: bool) -> list[Module]:
        """What the runner hooks, in run order: the layers (with `modules`, each preceded by its
        sub-modules), then the final modules. The embeddings come from the pass's own input."""
        out = []
        for i, layer in enumerate(self.layers):
            if modules:
                out += [Module(name, "sub", self.roles.get(name), i) for name in self.subs[i]]
            out.append(Module(layer, "layer", None, i))
        out += [Module(name, "final", self.roles.get(name)) for name in self.final]
        return out


def layer_count(config) -> int | None:
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for key in ("num_hidden_layers", "n_layer", "num_layers"):
        value = getattr(text_config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _experts(config) -> tuple[int | None, int | None]:
    """(experts, experts per token) from the config, or (None, None) for a dense model."""
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    per_token = getattr(text_config, "num_experts_per_tok", None)
    for key in ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"):
        value = getattr(text_config, key, None)
        if isinstance(value, int) and value > 1 and isinstance(per_token, int):
            return value, per_token
    return None, None


def _role(name: str, module: torch.nn.Module) -> str | None:
    leaf = name.rsplit(".", 1)[-1].lower()
    kind = type(module).__name__.lower()
    if "norm" in kind or "norm" in leaf or leaf.startswith("ln"):
        return NORM
    if "attn" in leaf or "attention" in kind:
        return ATTENTION
    if any(word in leaf for word in ("mlp", "moe", "expert", "feed_forward", "ffn", "fc")) or "mlp" in kind:
        return MLP
    return None


def discover(model, device: str) -> Structure:
    """Run the probe pass and read the model's structure off the hooks."""
    named = dict(model.named_modules())
    names_of = {id(module): name for name, module in named.items()}
    started: list[str] = []  # the first pass's pre-hook order: the order modules start running
    finished: list[str] = []  # the first pass's forward-hook order
    outputs: dict[str, list] = {}  # per module, its output in each probe pass
    passes = 0

    def before(module, args):
        nonlocal passes
        name = names_of[id(module)]
        passes += name == ""  # the model itself starts each pass
        if passes == 1:
            started.append(name)

    def after(module, args, output):
        name = names_of[id(module)]
        if passes == 1:
            finished.append(name)
        outputs.setdefault(name, []).append(output)

    handles = [m.register_forward_pre_hook(before) for m in named.values()]
    handles += [m.register_forward_hook(after) for m in named.values()]
    try:
        logits = _probe(model, device)
    finally:
        for handle in handles:
            handle.remove()

    layers_list = _decoder_layers(model, named, started)
    layer_names = tuple(names_of[id(layer)] for layer in layers_list)
    head = model.get_output_embeddings()
    head_name = names_of.get(id(head), "")
    embedding = names_of.get(id(model.get_input_embeddings()), "embed")
    n_experts, per_token = _experts(model.config)
    run_order = _first_seen(started)
    roles: dict[str, str | None] = {}  # (None: no role found; left out of the structure)
    subs = []
    routers = []
    for index, layer_name in enumerate(layer_names):
        children = [f"{layer_name}.{child}" for child, module in named[layer_name].named_children()]
        ran = [c for c in run_order if c in children and _has_parameters(named[c])]
        subs.append(tuple(ran))
        roles.update((c, _role(c, named[c])) for c in ran)
        if n_experts:
            for name in run_order:
                first_output = outputs.get(name, [None])[0]
                if name.startswith(layer_name + ".") and _scores_experts(first_output, n_experts, named[name]):
                    routers.append((index, name))
                    roles[name] = ROUTER
                    break
    final = _after_last_layer(finished, started, layer_names, head_name, named)
    # Where the first layer mixes tokens (attention) and before any router (an MoE layer groups a
    # batch's tokens per expert, which moves rounding), a causal model's earlier positions stay exact.
    watched = list(subs[0] if subs else ())
    if routers and routers[0][0] == 0:
        router = routers[0][1]
        watched = [n for n in watched if started.index(n) < started.index(router) and not router.startswith(n + ".")]
    elif layer_names:
        watched.append(layer_names[0])
    probes = [[module_output(o) for o in outputs[n]] for n in watched if len(outputs.get(n, ())) == 3] or [logits]
    causal = all(_earlier_positions_kept(*passes) for passes in probes)
    roles.update((name, _role(name, named[name])) for name in final)
    return Structure(
        embedding=embedding,
        layers=layer_names,
        subs=tuple(subs),
        roles={k: v for k, v in roles.items() if v},
        final=final,
        routers=tuple(routers),
        experts_per_token=per_token if routers else None,
        causal=causal,
        finite=all(bool(t.isfinite().all()) for t in logits),
    )


def _earlier_positions_kept(first: torch.Tensor, again: torch.Tensor, changed: torch.Tensor) -> bool:
    """Earlier positions moved by no more than the kernels' own run-to-run noise (zero where they are
    deterministic) when the last token changed."""
    first, again, changed = (t.reshape(1, 6, -1)[:, :-1].float() for t in (first, again, changed))
    noise = (first - again).abs().max().item()
    return (first - changed).abs().max().item() <= 10 * noise


def _probe(model, device: str) -> list[torch.Tensor]:
    """Three passes of one shape: a text, the same text again (the kernels' run-to-run noise) and the
    text with its last token changed. Returns the logits of each; the hooks keep every module's output."""
    vocab = model.get_input_embeddings().weight.shape[0]
    first = torch.tensor([[1, 2, 3, 4, 5, 6]], device=device) % vocab
    changed = first.clone()
    changed[0, -1] = 7 % vocab
    with torch.inference_mode():
        return [
            model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits
            for ids in (first, first, changed)
        ]


def _first_seen(names: list[str]) -> list[str]:
    return list(dict.fromkeys(names))


def _has_parameters(module: torch.nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def _decoder_layers(model, named: dict, started: list[str]) -> list[torch.nn.Module]:
    """The ModuleList of decoder layers: its items all ran, as many as the config's layers; among
    candidates (a list of experts can match the count too), the one holding the most parameters."""
    ran = set(started)
    wanted = layer_count(model.config)
    candidates: list[torch.nn.ModuleList] = []
    for name, module in named.items():
        if isinstance(module, torch.nn.ModuleList) and len(module) > 0:
            items = [f"{name}.{i}" for i in range(len(module))]
            if all(item in ran for item in items) and (wanted is None or len(module) == wanted):
                candidates.append(module)
    if not candidates:
        return []
    largest: torch.nn.ModuleList = max(candidates, key=_weights)
    return list(largest)


def _weights(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _after_last_layer(finished, started, layer_names, head_name, named) -> tuple[str, ...]:
    """Modules with parameters that finish after the last layer and start before the head, other than
    the layers' own ancestors (the decoder that holds them finishes then too) and wrappers of another."""
    if not layer_names:
        return ()
    before_head = set(started[: started.index(head_name)] if head_name in started else started)
    out: list[str] = []
    for name in finished[finished.index(layer_names[-1]) + 1 :]:
        if not name or name not in before_head or not _has_parameters(named[name]):
            continue
        if any(layer == name or layer.startswith(name + ".") for layer in layer_names):
            continue
        if not any(name.startswith(o + ".") for o in out):
            out.append(name)
    return tuple(n for n in out if not any(o.startswith(n + ".") for o in out))


def _scores_experts(output, n_experts: int, module: torch.nn.Module) -> bool:
    """A router: a projection onto the experts (a weight with a row per expert) whose first output scores
    tokens over them ([tokens, experts] or [b, T, experts]). A norm or projection that only happens to be as
    wide as the number of experts (Jamba's `dt_layernorm`) is not one."""
    if output is None or isinstance(module, torch.nn.ModuleList):
        return False
    weight = getattr(module, "weight", None)
    if not (isinstance(weight, torch.Tensor) and weight.dim() == 2 and n_experts in weight.shape):
        return False
    scores = module_output(output)
    return isinstance(scores, torch.Tensor) and scores.is_floating_point() and scores.shape[-1] == n_experts


def chosen_experts(output, experts_per_token: int) -> torch.Tensor:
    """The experts a router chose per token, [tokens, k] sorted: its own choice where it returns one
    (an integer tensor), else the top-k of its scores (softmax keeps their order)."""
    if isinstance(output, tuple):
        for item in output:
            if isinstance(item, torch.Tensor) and not item.is_floating_point() and item.shape[-1] == experts_per_token:
                return item.reshape(-1, experts_per_token).sort(dim=-1).values
    scores = module_output(output)
    return scores.reshape(-1, scores.shape[-1]).topk(experts_per_token, dim=-1).indices.sort(dim=-1).values
