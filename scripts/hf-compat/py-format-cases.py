"""Python's printf-style formatting (`fmt % args`) and its /, // and % of numbers, the reference for
src/tokenizer/py-format.ts: every case below, computed by this Python, with its result or its exception (type and message). Values are written typed, so that a float
stays a float and a tuple a tuple: {"i": 3}, {"f": "0.1"} (repr, read back exactly), {"s": "x"}, {"b": true},
{"n": null}, {"t": [...]} (tuple), {"l": [...]} (list), {"d": {...}} (dict). Floats over random magnitudes and digits
exercise the rounding (half to even on the exact binary value) at every conversion.

Usage: python3 scripts/hf-compat/py-format-cases.py test/fixtures/py-format
"""
import json
import math
import os
import random
import sys

folder = sys.argv[1]


def enc(v):
    if isinstance(v, bool):
        return {'b': v}
    if isinstance(v, int):
        return {'i': v}
    if isinstance(v, float):
        return {'f': repr(v)}
    if isinstance(v, str):
        return {'s': v}
    if v is None:
        return {'n': None}
    if isinstance(v, tuple):
        return {'t': [enc(x) for x in v]}
    if isinstance(v, list):
        return {'l': [enc(x) for x in v]}
    if isinstance(v, dict):
        return {'d': {k: enc(x) for k, x in v.items()}}
    raise TypeError(type(v))


cases = []


def case(fmt, args):
    try:
        out = {'text': fmt % args}
    except Exception as e:  # the exception a template would raise
        out = {'error': '%s: %s' % (type(e).__name__, e)}
    cases.append({'fmt': fmt, 'args': enc(args), **out})


# conversions, flags, widths, precisions, mappings and the errors Python raises
for fmt, args in [
    ('%s-%d', ('a', 3)), ('%d%%', 5), ('%%d %d', 5), ('%(a)s/%(b)r', {'a': 1, 'b': 'x'}), ('%s %(a)s', {'a': 1}),
    ('x', {'a': 1}), ('%s', {'a': 1}), ('%s', [1, 2]), ('%s %s', [1, 2]), ('%s', (1, 2)), ('%d %s', (1,)), ('x', 1),
    ('%s', None), ('%s %r %a', ('é', 'é', 'é')), ('%r', "it's"), ('%.3s|%5s|%-5s|%05s', ('abcdef', 'ab', 'cd', 'ef')),
    ('%c%c%c', (233, 'é', True)), ('%c', 'ab'), ('%c', -1), ('%c', 2.0),
    ('%d %i %u', (3.99, -3.99, True)), ('%+d % d %05d %-5d|', (3, 3, -3, 3)), ('% 05d|%+05d', (3, -3)),
    ('%o %x %X %#o %#x %#X %#x', (8, 255, 255, 8, 255, 255, -255)), ('%.5d|%8.3x', (42, 255)),
    ('%x', 2.0), ('%d', 'a'), ('%f', 'a'), ('%d', None), ('%d', float('nan')), ('%d', float('inf')),
    ('%q', 1), ('%', 1), ('%(a', {}), ('%5%', (1,)), ('%5%', ()), ('%(a)s', [1]), ('%(a)s', 1), ('%(z)s', {'a': 1}),
    ('%*d|%-*d|%.*f|%*d|', (5, 3, 4, 7, 2, 3.14159, -5, 3)), ('%ld %hd %Lf', (1, 2, 0.5)),
    ('%f %F %e %E %g %G', (float('nan'),) * 6), ('%f %F %e %E %g %G', (float('inf'),) * 6), ('%05f|%-6f|%+f', (float('inf'), float('-inf'), float('nan'))),
    ('%.0f %.0f %.0f %.2f %.1f %.1f %.2f', (0.5, 1.5, 2.5, 0.125, 0.05, 0.25, 2.675)),
    ('%g %g %g %g %#g %g %g %g', (100000, 1000000, 0.0001, 123.456, 1.0, 0, -0.0, 1e16)),
    ('%.3g %.3g %g %.10g %.17g %.20f', (1234567, 0.00012345, 123456789012, 0.1, 0.1, 0.1)),
    ('%e %.0e %#.0e %#.0f %.3e %.3e %e', (0, 12345, 12345, 2.5, 9.9995, 9.9994e10, 1e-320)),
    ('%f %08.3f %+.2e %5.1f|%-8.2e|%.2f', (-0.0, -3.14159, 0.000123, 2.25, 12345.678, 1e21)),
    ('%g %.0g %#.3g %G', (999999.5, 0.5, 100.0, 1.5e-7)),
    ('%s %s %s', (1.0, 1e-05, 1e16)),
    # ints past 2^53 (exact doubles), a list or a dict as the mapping, a keyed conversion then a positional one
    ('%d|%x|%o|%d|%i', (2 ** 60, 2 ** 60, 2 ** 60, -2 ** 60, 1e22)), ('x', [1]), ('%(a)s %s', {'a': 1}),
]:
    case(fmt, args)

# floats of random magnitudes and digits at every float conversion and precisions 0 to 17 (the rounding)
rng = random.Random(20261130)
for _ in range(400):
    kind = rng.random()
    if kind < 0.4:
        x = rng.uniform(-1, 1) * 10 ** rng.randint(-30, 30)
    elif kind < 0.7:  # few digits: ties at some precision
        x = rng.randint(-99999, 99999) / 2 ** rng.randint(0, 12)
    else:
        x = rng.choice([0.1, 0.2, 0.3, 1 / 3, 2 / 3, math.pi, math.e, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 123456789.125, 0.045, 1.005])
        x *= rng.choice([1, -1])
    conv = rng.choice('eEfFgG')
    prec = rng.randint(0, 17)
    flags = rng.choice(['', '#', '+', ' ', '0', '-', '#0'])
    width = rng.choice(['', '12', '25'])
    case('%' + flags + width + '.' + str(prec) + conv, x)
    case('%' + conv, x)

# Python's /, // and % of numbers: ints, floats, signs, zeros, infinities, and quotients that round to an integer
arith = []
values = [7, -7, 3, -3, 0, 1, 2 ** 40, 7.5, -7.5, 0.1, -0.1, 0.4, 4.0, 1.0, -0.0, 0.0, 1e-300, 1e300, float('inf'), float('-inf'), float('nan')]
values += [rng.uniform(-1, 1) * 10 ** rng.randint(-5, 5) for _ in range(10)] + [rng.randint(-1000, 1000) for _ in range(4)]
for a in values:
    for b in values:
        for op in ('/', '//', '%'):
            try:
                r = {'/': lambda: a / b, '//': lambda: a // b, '%': lambda: a % b}[op]()
                arith.append({'op': op, 'a': enc(a), 'b': enc(b), 'value': enc(r)})
            except Exception as e:
                arith.append({'op': op, 'a': enc(a), 'b': enc(b), 'error': '%s: %s' % (type(e).__name__, e)})

out = os.path.join(folder, 'python-format.json')
json.dump({'source': 'Python %s' % sys.version.split()[0], 'cases': cases, 'arith': arith}, open(out, 'w', encoding='utf-8'), ensure_ascii=False, indent=0)
print('wrote %d cases and %d arithmetic ones to %s' % (len(cases), len(arith), out))
