"""Chat-template fixtures for continue_final_message, from transformers itself: every template of
test/fixtures/chat-templates/conversations.json (with each of its template options) renders conversations that end in
an assistant turn to continue (a gen_prefix, as lm-evaluation-harness renders one: add_generation_prompt off,
continue_final_message on), with transformers' apply_chat_template. Writes continued.json into the fixtures folder;
test/tokenizer/chat.test.ts compares distillery's rendering with it. Run where transformers is installed (the GPU
machine has 5.17):

    python3 scripts/hf-compat/continue-fixtures.py <tokenizer.json> test/fixtures/chat-templates
"""
import json
import os
import sys

import transformers
import transformers.utils.chat_template_utils as ctu
from transformers import PreTrainedTokenizerFast

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixed_clock import fixed_datetime  # noqa: E402

tok_file, folder = sys.argv[1], sys.argv[2]
spec = json.load(open(os.path.join(folder, 'conversations.json')))
ctu.datetime = fixed_datetime(spec['now'])  # strftime_now reads datetime.now() there
Q = 'Which is larger, 3 or 5?\nA. 3\nB. 5\nYour response should end with "The best answer is [the_answer_letter]".'
conversations = {
    'prefix': [{'role': 'user', 'content': Q}, {'role': 'assistant', 'content': 'The best answer is'}],
    'prefix-trailing-space': [{'role': 'system', 'content': 'Be exact.'}, {'role': 'user', 'content': Q}, {'role': 'assistant', 'content': 'Answer: '}],
    'prefix-after-examples': [{'role': 'user', 'content': 'Question: 1 + 1?\nAnswer:'}, {'role': 'assistant', 'content': "Let's think step by step. 1 + 1 = 2.\n#### 2"},
                              {'role': 'user', 'content': 'Question: 2 + 3?\nAnswer:'}, {'role': 'assistant', 'content': "Let's think step by step."}],
    'prefix-leading-newline': [{'role': 'user', 'content': Q}, {'role': 'assistant', 'content': '\nReasoning:'}],
}
cases = []
for tname, t in spec['templates'].items():
    template = open(os.path.join(folder, t['file']), encoding='utf-8').read()
    tok = PreTrainedTokenizerFast(tokenizer_file=tok_file, bos_token=t['bos_token'], eos_token=t['eos_token'])
    tok.chat_template = template
    for cname, messages in conversations.items():
        for kwargs in t['kwargs']:
            case = {'template': tname, 'conversation': cname, 'messages': messages, 'kwargs': kwargs}
            try:
                case['text'] = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False, continue_final_message=True, **kwargs)
            except Exception as e:  # a template that cannot be continued is a fixture too
                case['error'] = str(e)
            cases.append(case)
            print(f"continue-fixtures {tname} {cname} {json.dumps(kwargs)}: {'error: ' + case['error'] if 'error' in case else repr(case['text'][-60:])}")
json.dump({'source': 'transformers %s' % transformers.__version__, 'now': spec['now'], 'cases': cases},
          open(os.path.join(folder, 'continued.json'), 'w', encoding='utf-8'), ensure_ascii=False, indent=1)
print(f'wrote {len(cases)} cases to {folder}/continued.json')
