// `-D name=value` values arrive as strings: these read them as numbers, naming a bad one.
local onlyChars(text, allowed) =
  std.length(text) > 0 && std.all([std.member(allowed, c) for c in std.stringChars(text)]);

{
  int(name)::
    local text = std.extVar(name);
    local unsigned = if std.startsWith(text, '-') then std.substr(text, 1, std.length(text))
                     else text;
    if onlyChars(unsigned, '0123456789') then std.parseInt(text)
    else error '-D %s must be an integer, got "%s"' % [name, text],

  // An integer, or `default` when the value is empty (a default that differs between configs).
  intOr(name, default)::
    if std.extVar(name) == '' then default else self.int(name),

  // true or false.
  bool(name)::
    local text = std.extVar(name);
    if text == 'true' then true else if text == 'false' then false
    else error '-D %s must be true or false, got "%s"' % [name, text],

  // true, false, or `default` when the value is empty.
  boolOr(name, default)::
    if std.extVar(name) == '' then default else self.bool(name),

  number(name)::
    local text = std.extVar(name);
    if onlyChars(text, '0123456789.eE+-') && onlyChars(text[std.length(text) - 1], '0123456789')
    then std.parseJson(text)
    else error '-D %s must be a number, got "%s"' % [name, text],
}
