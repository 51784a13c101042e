"""Chat-template fixtures from transformers itself: for every template and conversation in
test/fixtures/chat-templates/conversations.json, transformers' apply_chat_template renders the text and the token ids
(with Qwen's tokenizer.json for every template: the ids check the rendered text, tokenized by one tokenizer) and, for
templates with {% generation %} markers, the assistant-token mask. The clock strftime_now reads is fixed to the
fixtures' "now" date. Writes expected.json into the fixtures folder; distillery's tests compare with it.

Usage: python3 scripts/hf-compat/chat-fixtures.py <tokenizer.json> <fixtures dir> [--text-only]
  --text-only: without transformers, render the text with plain jinja2 in transformers' settings (sandboxed,
  trim_blocks, lstrip_blocks, loopcontrols, {% generation %}, raise_exception, strftime_now, tojson without ASCII
  escaping or key sorting); no ids and no masks.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixed_clock import fixed_datetime  # noqa: E402

tok_file, folder = sys.argv[1], sys.argv[2]
text_only = '--text-only' in sys.argv
spec = json.load(open(os.path.join(folder, 'conversations.json')))
FixedDatetime = fixed_datetime(spec['now'])

if text_only:
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        tags = {'generation'}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(['name:endgeneration'], drop_needle=True)
            return nodes.CallBlock(self.call_method('_render', []), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise RuntimeError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, 'jinja2.ext.loopcontrols'])
    env.filters['tojson'] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals['raise_exception'] = raise_exception
    env.globals['strftime_now'] = lambda fmt: FixedDatetime.now().strftime(fmt)
    source = "jinja2 %s (transformers' settings)" % __import__('jinja2').__version__
else:
    import transformers
    import transformers.utils.chat_template_utils as ctu
    from transformers import PreTrainedTokenizerFast
    ctu.datetime = FixedDatetime  # strftime_now reads datetime.now() there
    source = 'transformers %s' % transformers.__version__

cases = []
for tname, t in spec['templates'].items():
    template = open(os.path.join(folder, t['file']), encoding='utf-8').read()
    if not text_only:
        tok = PreTrainedTokenizerFast(tokenizer_file=tok_file, bos_token=t['bos_token'], eos_token=t['eos_token'])
        tok.chat_template = template
    for cname, conv in spec['conversations'].items():
        messages, tools = conv['messages'], conv.get('tools')
        gen = messages[-1]['role'] != 'assistant'
        for kwargs in t['kwargs']:
            case = {'template': tname, 'conversation': cname, 'kwargs': kwargs, 'add_generation_prompt': gen}
            try:
                if text_only:
                    case['text'] = env.from_string(template).render(
                        messages=messages, tools=tools, add_generation_prompt=gen,
                        bos_token=t['bos_token'] or '', eos_token=t['eos_token'] or '', **kwargs)
                else:
                    kw = dict(tools=tools, add_generation_prompt=gen, **kwargs)
                    case['text'] = tok.apply_chat_template(messages, tokenize=False, **kw)
                    out = tok.apply_chat_template(messages, tokenize=True, return_dict=True, **kw)
                    case['ids'] = list(out['input_ids'])
                    if '{% generation %}' in template or '{%- generation' in template:
                        m = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True, **kw)
                        case['assistant_mask'] = list(m['assistant_masks'])
            except Exception as e:  # a template that refuses a conversation is a fixture too
                case['error'] = str(e)
            cases.append(case)
            print(f"chat-fixtures {tname} {cname} {json.dumps(kwargs)}: {'error: ' + case['error'] if 'error' in case else str(len(case['text'])) + ' chars'}")

json.dump({'source': source, 'tokenizer': os.path.basename(tok_file), 'now': spec['now'], 'cases': cases},
          open(os.path.join(folder, 'expected.json'), 'w', encoding='utf-8'), ensure_ascii=False, indent=1)
print(f'wrote {len(cases)} cases ({source}) to {folder}/expected.json')
