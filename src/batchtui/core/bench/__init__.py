"""`batchtui bench`: what a comparison costs next to the forward passes it compares (a package above every part
it times: `methods` what is timed, `rounds` the rounds and ratios, `clock` the timing and memory, `targets` the
limits, `figures` what comes out, `phase_clock` a generation's passes by phase, `rollouts_methods` the rollouts rows).

Twelve methods on the same model and texts, interleaved over rounds, each timed by its best round (other load on
the machine only ever slows a round: the least disturbed one is the closest to what the method costs, as timeit
has it; a method of under a second is tried three times a round). A ratio of two methods is the median of their
rounds' ratios: the two are timed a few seconds apart in a round, where a box whose speed flips for minutes at a
time (a fifth, on the 2-core boxes measured) can give one method its fast spell and the other none between two
rounds' bests (so each ratio's two methods are timed one right after the other: `RUNS`):
(a) the floor: bare forward passes (one batched pass per chunk, one single pass per text);
(b) the seed's script for every text: batched pass, its padded rows alone, torch.allclose;
(c) compare() as the CLI runs it; (d) compare() with per-module localization;
(e) the generation floor: bare greedy `generate` calls (one per left-padded chunk, one per text alone);
(f) generate_and_compare() as `batchtui generate` runs it, on the same number of new tokens;
(g), (h) compare() and generate_and_compare() in the batch-invariant mode: what the same logits cost;
(i), (j) the trainer's forward over the texts' greedy continuations (`trainer_forward`: training mode, autograd on)
outside and in the mode: what the sampler's logits cost a trainer; (k), (l) a trainer's step over them (that forward,
a token-mean loss, its backward) outside and in the mode.
Both generations' forward passes are also timed by phase (prefill, decode: `phase_clock`; their ratios too are
the medians of the rounds' ratios, each round's from its best try), and the mode's
matmul paths are listed per shape (the library, padded to the height from which it keeps rows, oneDNN, or
fixed-height tiles), with the CPU kernels it leaves to the library for this
model (calls that never need replacing): why the mode costs what it costs on this machine.
Peak memory: on CUDA max_memory_allocated above what was allocated before (the weights); on the
CPU the peak resident-set growth, sampled.
"""
