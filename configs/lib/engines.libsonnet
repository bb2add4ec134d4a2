// Engine configs by name: `engine(name, precision, lr)` gives the `engine` field of the train step.
local optimizer(lr) = { type: 'torch::AdamW', lr: lr, weight_decay: 0.0 };

local available = {
  ddp: 'tango_fairscale::ddp',
};
local planned = ['fairscale', 'fsdp2', 'pipe'];

{
  engine(name, precision, lr)::
    if std.objectHas(available, name) then
      { type: available[name], precision: precision, optimizer: optimizer(lr) }
    else if std.member(planned, name) then
      error "engine '%s' is not available yet in this version of tango_fairscale; use -D engine=ddp" % name
    else
      error "unknown engine '%s'; choose one of ddp, fairscale, fsdp2, pipe" % name,
}
