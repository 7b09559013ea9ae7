#pragma once
// Module-level timings of the classifier's attention layers (TransNeXt aggregated attention in stages 1–3, full
// attention in stage 4) at a MoH-ViT variant's shapes: for every stage whose layers route heads, the same layer as
// plain MHA (every head, no router), MoH on the dense path (the official code: every head, then gates) and MoH on
// the sparse path (only the selected (token, head) pairs), forward (eval) and forward + backward (training, aux loss
// included), timed round-robin; ratios are to the dense path and to MHA measured in the same run.
namespace moh::bench {

/// `moh bench vit-attention [--model NAME] [--batch B] [--img-size S] [--runs R] [--warmup W] [--threads T] [--json]`.
int vit_attention_bench_main(int argc, char** argv);

}  // namespace moh::bench
