// Engine configs by name: `engine(name, precision, lr)` gives the `engine` field of the train step.
// The sharded engines share one `sharding` block (tango_fairscale.wrapping.ShardingConfig); its
// defaults shard each transformer block.
local optimizer(lr) = { type: 'torch::AdamW', lr: lr, weight_decay: 0.0 };

local engines = {
  ddp: { type: 'tango_fairscale::ddp' },
  fairscale: { type: 'tango_fairscale::fairscale', sharding: {} },
  fsdp2: { type: 'tango_fairscale::fsdp2', sharding: {} },
};
local planned = ['pipe'];

{
  engine(name, precision, lr)::
    if std.objectHas(engines, name) then
      engines[name] { precision: precision, optimizer: optimizer(lr) }
    else if std.member(planned, name) then
      error "engine '%s' is not available yet in this version of tango_fairscale; use -D engine=ddp, fairscale or fsdp2" % name
    else
      error "unknown engine '%s'; choose one of ddp, fairscale, fsdp2, pipe" % name,
}
