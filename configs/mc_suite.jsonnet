// Evaluate a causal LM on a suite of lm-evaluation-harness multiple-choice tasks, each scored and
// cached in a step of its own; with -D train_steps=N it is first fine-tuned on train_task.
//
//   tango run configs/mc_suite.jsonnet -w workspace -D model=/models/smollm2 \
//       -D tasks=piqa,arc_easy,hellaswag -D task_data_dir=/data/tasks
//   tango-fairscale results -w workspace          # tasks × metrics, with standard errors
//
// External variables (`-D name=value`; defaults in tango.yml's `environment`):
//   tasks          comma-separated lm-eval task, group or tag names        piqa,arc_easy,...,copa
//   task_data_dir  local data: <dir>/<task>/<split>.jsonl in each task's    "" (the hub)
//                  own schema; empty = the tasks' hub datasets
//   include_path   a folder of task YAMLs of your own: a name in tasks is   ""
//                  looked up there first (lm_eval's --include_path)
//   data_dir       the official PIQA files (as gpt2_piqa.jsonnet): task piqa   ""
//                  reads them (a `piqa` step) instead of task_data_dir/piqa
//   num_fewshot    few-shot examples per context; empty = each task's own   0
//                  (lm_eval's default: tango-fairscale eval's without --num_fewshot)
//   fewshot_seed   seeds the choice of few-shot examples (lm_eval's --seed)   1234
//   gen_kwargs     a JSON object laid over each generate_until task's       ""
//                  generation_kwargs (lm_eval's --gen_kwargs): '{"max_gen_toks": 64}'
//   train_steps    optimizer steps of fine-tuning first; 0 = evaluate only      0
//   model, engine, precision, device_count, batch_size, lr, seed, validate_every,
//   warmup_steps, lr_decay, log_every                                    as gpt2_piqa.jsonnet
//   limit          documents per task, or a fraction of each (0.1: a tenth,  0
//                  rounded up, as lm_eval's --limit); 0 = all
//   train_task     the task trained on when train_steps > 0 (its training split)   piqa
//   apply_chat_template   prompts in the tokenizer's chat template (lm-eval's own)   false
//   fewshot_as_multiturn  few-shot examples as chat turns; empty = lm-eval's     ""
//                         default (true with the chat template)
//   system_instruction    a system prompt (lm-eval's --system_instruction)   ""
//
// Steps: `requests_<task>` for each task (lm-eval's requests, built once for every model: a
// second model on the same tasks in the same workspace builds none), `tokens_<task>` (those
// requests tokenized, once for every model of the same tokenizer files), `scores_<task>` (the
// model's log-likelihoods or generated texts and lm-eval's results), `metrics` (all tasks'
// lm-eval results and a flat summary), `trained_model` when training. With apply_chat_template
// there are no `requests_`/`tokens_` steps: the prompts depend on the model's tokenizer, and
// each `scores_<task>` builds its own.
local engines = import 'lib/engines.libsonnet';
local variables = import 'lib/variables.libsonnet';

local train_steps = variables.intOr('train_steps', 0);  // tango.yml: '' = evaluate only
local limit = variables.number('limit');  // documents per task, or a fraction of each (< 1)
local num_fewshot = variables.intOr('num_fewshot', null);  // null: each task's own
local fewshot_seed = variables.int('fewshot_seed');
local gen_kwargs = std.extVar('gen_kwargs');
assert gen_kwargs == '' || std.startsWith(std.stripChars(gen_kwargs, ' '), '{') :
       '-D gen_kwargs must be a JSON object, e.g. {"max_gen_toks": 64}, got "%s"' % gen_kwargs;
local chat = variables.bool('apply_chat_template');
local multiturn = variables.boolOr('fewshot_as_multiturn', null);  // null: TaskSpec's (true)
local system_instruction = std.extVar('system_instruction');
local schedule = {
  warmup_steps: variables.int('warmup_steps'),
  train_steps: train_steps,
  decay: std.extVar('lr_decay'),
};
local data_dir = std.extVar('task_data_dir');
local include_path = std.extVar('include_path');
local piqa_dir = std.extVar('data_dir');
local names = [std.stripChars(name, ' ') for name in std.split(std.extVar('tasks'), ',')
               if std.stripChars(name, ' ') != ''];
local model = { type: 'tango_fairscale::causal_lm', model: std.extVar('model') };
local ref(name) = { type: 'ref', ref: name };

local repeated = std.set([name for name in names if std.count(names, name) > 1]);

assert std.length(names) > 0 : '-D tasks must name at least one lm-eval task';
assert std.length(repeated) == 0 :
       '-D tasks lists %s more than once; list each task once' % std.join(', ', repeated);
assert train_steps >= 0 : 'train_steps must be 0 (evaluate only) or positive';
assert chat || multiturn != true :
       '-D fewshot_as_multiturn=true needs -D apply_chat_template=true (turns of a chat template)';
assert limit >= 0 && (limit < 1 || limit == std.floor(limit)) :
       'limit must be 0 (all examples) or positive: a number of documents, or a fraction of '
       + 'each task\'s below 1 (0.1), got %s' % limit;
local precisions = ['auto', '32-true', 'bf16-mixed', '16-mixed', 'bf16-true'];
assert std.member(precisions, std.extVar('precision')) :
       '-D precision must be one of %s, got "%s"' % [std.join(', ', precisions), std.extVar('precision')];

local official_piqa(name) = name == 'piqa' && piqa_dir != '';
local task(name) = {
  name: name,
  num_fewshot: num_fewshot,
  [if fewshot_seed != 1234 then 'fewshot_seed']: fewshot_seed,  // else TaskSpec's, lm-eval's
  [if chat then 'apply_chat_template']: true,
  [if chat && multiturn != null then 'fewshot_as_multiturn']: multiturn,
  [if system_instruction != '' then 'system_instruction']: system_instruction,
  [if include_path != '' then 'include_path']: include_path,
  [if gen_kwargs != '' then 'gen_kwargs']: std.parseJson(gen_kwargs),
  [if limit > 0 then 'limit']: limit,
  [if official_piqa(name) then 'dataset']: ref('piqa'),
  [if data_dir != '' && !official_piqa(name) then 'data_dir']: data_dir + '/' + name,
};
local reads_piqa = std.member(names, 'piqa') || (train_steps > 0 && std.extVar('train_task') == 'piqa');

{
  steps: {
    // The official PIQA files, when -D data_dir names them (lm-eval's piqa task reads them).
    [if reads_piqa && piqa_dir != '' then 'piqa']: { type: 'tango_fairscale::piqa', data_dir: piqa_dir },
    [if train_steps > 0 then 'trained_model']: {
      type: 'tango_fairscale::train',
      model: model,
      engine: engines.engine(std.extVar('engine'), std.extVar('precision'),
                             variables.number('lr'), schedule),
      task: task(std.extVar('train_task')),
      validate_tasks: [task(name) for name in names],
      train_steps: train_steps,
      batch_size: variables.int('batch_size'),
      seed: variables.int('seed'),
      validate_every: variables.int('validate_every'),
      runtime: {  // how the run is carried out (not in the step's cache key)
        device_count: variables.int('device_count'),
        log_every: variables.int('log_every'),
        pack_sequences: null,  // packed where the engine's model takes packed batches
      },
    },
  } + {
    // lm-eval's requests of each task, built once: every model scored on the task in this
    // workspace takes them from the cache.
    // (Chat-templated prompts depend on the model's tokenizer: each scores step builds its own.)
    ['requests_' + name]: { type: 'tango_fairscale::task_requests', task: task(name) }
    for name in names
    if !chat
  } + {
    // ... tokenized once for every model whose tokenizer has the same files (a trained model
    // keeps its base model's tokenizer).
    ['tokens_' + name]: {
      type: 'tango_fairscale::task_tokens',
      requests: ref('requests_' + name),
      tokenizer: std.extVar('model'),
    }
    for name in names
    if !chat
  } + {
    ['scores_' + name]: {
      type: 'tango_fairscale::task_scores',
      model: if train_steps > 0 then ref('trained_model') else model,
      task: task(name),
      [if !chat then 'requests']: ref('requests_' + name),
      [if !chat then 'tokens']: ref('tokens_' + name),
      precision: std.extVar('precision'),
      pack_sequences: null,
    }
    for name in names
  } + {
    metrics: {
      type: 'tango_fairscale::task_metrics',
      scores: [ref('scores_' + name) for name in names],
    },
  },
}
