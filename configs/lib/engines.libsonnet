// Engine configs by name: `engine(name, precision, lr, schedule)` gives the `engine` field of the
// train step; `schedule` is {warmup_steps, train_steps, decay} (tango_fairscale::warmup). The
// sharded engines share one `sharding` block (tango_fairscale.parallel.sharding.ShardingConfig);
// its defaults shard each transformer block.
local optimizer(lr) = { type: 'torch::AdamW', lr: lr, weight_decay: 0.0 };

local engines = {
  ddp: { type: 'tango_fairscale::ddp' },
  fairscale: { type: 'tango_fairscale::fairscale', sharding: {} },
  fsdp2: { type: 'tango_fairscale::fsdp2', sharding: {} },
  // Pipeline stages over every visible GPU (two CPU stages without GPUs); run with device_count=1.
  pipe: { type: 'tango_fairscale::pipe' },
};

{
  engine(name, precision, lr, schedule)::
    if std.objectHas(engines, name) then
      engines[name] {
        precision: precision,
        optimizer: optimizer(lr),
        [if schedule.warmup_steps != 0 || schedule.decay != 'constant' then 'lr_scheduler']:
          { type: 'tango_fairscale::warmup' } + schedule,
      }
    else
      error "unknown engine '%s'; choose one of ddp, fairscale, fsdp2, pipe" % name,
}
