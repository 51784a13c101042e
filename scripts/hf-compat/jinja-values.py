"""Python's printing of template values, from jinja2 itself in transformers' settings (the sandboxed environment with
trim_blocks and lstrip_blocks, and transformers' tojson: json.dumps without ASCII escaping or key sorting by default):
every probe of test/fixtures/chat-templates/python-values-probes.json rendered over its variables. Writes
python-values.json beside it; test/tokenizer/jinja-python.test.ts compares distillery's rendering with it.

Usage: python3 scripts/hf-compat/jinja-values.py test/fixtures/chat-templates
"""
import json
import os
import sys

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

folder = sys.argv[1]
spec = json.load(open(os.path.join(folder, 'python-values-probes.json'), encoding='utf-8'))
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=['jinja2.ext.loopcontrols'])
env.filters['tojson'] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
    x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
cases = []
for probe in spec['probes']:
    cases.append({'template': probe, 'text': env.from_string(probe).render(**spec['vars'])})
json.dump({'source': "jinja2 %s (transformers' settings)" % jinja2.__version__, 'cases': cases},
          open(os.path.join(folder, 'python-values.json'), 'w', encoding='utf-8'), ensure_ascii=False, indent=1)
print(f'wrote {len(cases)} cases to {folder}/python-values.json')
