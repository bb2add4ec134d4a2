// Tango's own `torch::train` step with a tango_fairscale engine swapped in: sharded forward and
// backward, checkpoints torch::train resumes, and a final model consolidated from the rank files.
//
//   tango run examples/torch_train_fairscale.jsonnet -i examples/torch_train_piqa.py -w workspace \
//       -D engine=fairscale -D device_count=2 -D train_steps=200
//
// engine: ddp | fairscale | fsdp2 | pipe (pipe with device_count=1). The other variables (model,
// data_dir, precision, lr, seed, batch_size: per step over all processes, limit) default from
// tango.yml, as for configs/gpt2_piqa.jsonnet. The data is any DatasetDict and a DataCollator
// that makes our model's batches (input_ids, attention_mask, labels); here PIQA's correct answers.
local int(name) = std.parseInt(std.extVar(name));
local device_count = int('device_count');
local batch_size = int('batch_size');
local train_steps = int('train_steps');
assert batch_size % device_count == 0 : 'batch_size must divide by device_count';
// torch::train needs checkpoint_every and validate_every to divide one another.
local divisors = std.filter(function(d) train_steps % d == 0, std.range(1, std.min(100, train_steps)));

local loader(shuffle) = {
  batch_size: batch_size / device_count,  // torch::train's batch size is per process
  collate_fn: { type: 'examples::piqa_training_batches', model: std.extVar('model') },
} + if device_count > 1 then {
  sampler: { type: 'torch::DistributedSampler', shuffle: shuffle, seed: int('seed') },
} else { shuffle: shuffle };

{
  steps: {
    piqa: {
      type: 'tango_fairscale::piqa',
      data_dir: if std.extVar('data_dir') == '' then null else std.extVar('data_dir'),
      limit: if int('limit') == 0 then null else int('limit'),
    },
    trained_model: {
      type: 'torch::train',
      model: { type: 'tango_fairscale::causal_lm', model: std.extVar('model') },
      training_engine: {
        type: 'tango_fairscale::' + std.extVar('engine'),
        precision: std.extVar('precision'),
        optimizer: { type: 'torch::AdamW', lr: std.parseJson(std.extVar('lr')) },
      },
      dataset_dict: { type: 'ref', ref: 'piqa' },
      train_dataloader: loader(true),
      validation_split: 'validation',
      validation_dataloader: loader(false),
      train_steps: train_steps,
      // Validate (on the loss) and checkpoint at the end only: torch::train returns the best
      // checkpoint by validation loss, which otherwise need not be the last step's.
      validate_every: train_steps,
      checkpoint_every: divisors[std.length(divisors) - 1],
      log_every: 10,
      seed: int('seed'),
      device_count: device_count,
      // The result as a Hugging Face directory (from_pretrained loads it), not a pickle.
      step_format: { type: 'tango_fairscale::model' },
    },
  },
}
