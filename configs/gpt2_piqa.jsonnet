// Fine-tune a causal LM on PIQA and evaluate it with lm-evaluation-harness's `piqa` task.
//
//   tango run configs/gpt2_piqa.jsonnet -w workspace -D device_count=2
//
// External variables (`-D name=value`; the defaults live in tango.yml's `environment`, because
// Jsonnet cannot default a missing external variable):
//   model          Hugging Face model id or local directory (weights, config, tokenizer)   gpt2
//   data_dir       directory with the official PIQA files; empty = download them           ""
//   train_steps    optimizer steps; 0 = evaluate the model as it is ('' = 2000)            2000
//   device_count   processes / devices for training                                         1
//   engine         ddp | fairscale | fsdp2 | pipe                                           fairscale
//   precision      auto | 32-true | bf16-mixed | 16-mixed | bf16-true                      auto
//   batch_size     examples per optimizer step, over all devices                            16
//   lr             AdamW learning rate                                                      1e-5
//   seed           seed of the data order                                                   42
//   validate_every steps between in-training PIQA validation accuracies                    500
//   limit          at most this many examples per split; 0 = all                            0
//   warmup_steps   steps of linear learning-rate warmup                                     0
//   lr_decay       after warmup: constant | linear | cosine (to 0 at the last step)         constant
//   log_every      steps between logged losses, throughput and memory                      10
//
// Steps: `piqa` (the official files' documents), `trained_model` (absent when train_steps=0),
// `requests` (lm-eval's `piqa` requests, built once for every model scored on these files),
// `predictions` (lm-eval's `piqa` task scored: log-likelihoods, lm-eval's results) and
// `metrics` (acc, acc_norm, their standard errors, num_examples of the validation split).
local engines = import 'lib/engines.libsonnet';

local variables = import 'lib/variables.libsonnet';
local int = variables.int;
local number = variables.number;
local model_path = std.extVar('model');
local data_dir = std.extVar('data_dir');
local train_steps = variables.intOr('train_steps', 2000);  // tango.yml: '' = 2000
local limit = int('limit');
local lr = number('lr');
local schedule = {
  warmup_steps: int('warmup_steps'),
  train_steps: train_steps,
  decay: std.extVar('lr_decay'),
};

local model = { type: 'tango_fairscale::causal_lm', model: model_path };
local ref(name) = { type: 'ref', ref: name };

assert train_steps >= 0 : 'train_steps must be 0 (evaluate only) or positive, got %d' % train_steps;
assert lr > 0 : 'lr must be positive, got %s' % std.extVar('lr');
assert limit >= 0 : 'limit must be 0 (all examples) or positive, got %d' % limit;
// Checked here: with train_steps=0 only the scoring step reads it.
local precisions = ['auto', '32-true', 'bf16-mixed', '16-mixed', 'bf16-true'];
assert std.member(precisions, std.extVar('precision')) :
       '-D precision must be one of %s, got "%s"' % [std.join(', ', precisions), std.extVar('precision')];
assert !(std.extVar('engine') == 'pipe' && int('device_count') > 1) :
       "engine 'pipe' drives all its devices from one process: set -D device_count=1";

// lm-eval's `piqa` task (its prompts, choices and metrics) over the official files' documents.
local piqa = { name: 'piqa', dataset: ref('piqa') };

{
  steps: {
    piqa: {
      type: 'tango_fairscale::piqa',
      data_dir: if data_dir == '' then null else data_dir,
      limit: if limit == 0 then null else limit,
    },
    [if train_steps > 0 then 'trained_model']: {
      type: 'tango_fairscale::train',
      model: model,
      engine: engines.engine(std.extVar('engine'), std.extVar('precision'), lr, schedule),
      task: piqa,
      train_steps: train_steps,
      batch_size: int('batch_size'),
      seed: int('seed'),
      validate_every: int('validate_every'),
      // How the run is carried out, not what it trains (not in the step's cache key). Packed:
      // queries end to end instead of padded rows where the model takes packed batches (null);
      // padded under the pipe engine and for models such as Bloom.
      runtime: {
        device_count: int('device_count'),
        log_every: int('log_every'),
        pack_sequences: null,
      },
    },
    // lm-eval's requests of the `piqa` task, built once: another model scored on the same
    // files in this workspace takes them from the cache.
    requests: { type: 'tango_fairscale::task_requests', task: piqa },
    predictions: {
      type: 'tango_fairscale::task_scores',
      model: if train_steps > 0 then ref('trained_model') else model,
      task: piqa,
      requests: ref('requests'),
      precision: std.extVar('precision'),
      pack_sequences: null,  // packed where the model takes packed batches
    },
    metrics: {
      type: 'tango_fairscale::task_metrics',
      scores: [ref('predictions')],
    },
  },
}
