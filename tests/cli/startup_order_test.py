#!/usr/bin/env python3
"""The shipped binary is linked with src/cli/startup-order.ld: the code start-up runs lies together.

What can go wrong silently, and costs 3 MB of RSS when it does (tests/bench/README.md): the link leaves the script
out (a changed condition in src/cli/CMakeLists.txt), the objects lose -ffunction-sections (then our functions are
in plain .text and no pattern of ours matches), or the script stops being honoured. Each shows here as a function
the script names that is not inside the ordered section.

Usage: startup_order_test.py --agent BINARY --order src/cli/startup-order.ld
"""
import argparse
import re
import subprocess
import sys

SECTION = '.text.startup_order'


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--agent', required=True)
    parser.add_argument('--order', required=True)
    args = parser.parse_args()

    headers = subprocess.run(['readelf', '-SW', args.agent], capture_output=True, text=True, check=True).stdout
    ordered = re.search(r'\s' + re.escape(SECTION) + r'\s+PROGBITS\s+([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)', headers)
    if not ordered:
        sys.exit(f'FAIL: {args.agent} has no {SECTION} section: it was not linked with {args.order}')
    start, size = int(ordered[1], 16), int(ordered[2], 16)

    # Every function the script names by its own section (`*(.text.<symbol>)`) and the binary defines.
    named = set(re.findall(r'^\s+\*\(\.text\.([A-Za-z0-9_.$]+)\)$', open(args.order).read(), re.M))
    defined = {}
    symbols = subprocess.run(['nm', '--defined-only', args.agent], capture_output=True, text=True, check=True).stdout
    for line in symbols.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[1] in 'tTW':
            defined.setdefault(fields[2], int(fields[0], 16))
    ours = [s for s in named if s in defined and s.startswith('_ZN10vfio_agent')]
    present = [s for s in named if s in defined]
    outside = sorted(s for s in present if not start <= defined[s] < start + size)
    print(f'{SECTION}: {size // 1024} kB at {start:#x}; the script names {len(named)} functions, '
          f'{len(present)} of them in the binary ({len(ours)} of the agent\'s own), {len(outside)} outside')
    if len(ours) < 100:
        sys.exit(f'FAIL: only {len(ours)} of the agent\'s own functions named by {args.order} are in the binary: '
                 'the objects were built without -ffunction-sections, or the script is stale '
                 '(scripts/startup-order.sh)')
    if outside:
        sys.exit(f'FAIL: {len(outside)} functions the script places in {SECTION} are outside it, e.g. '
                 + ', '.join(outside[:5]))
    for entry in ('main', 'grpc_init'):
        if entry not in defined or not start <= defined[entry] < start + size:
            sys.exit(f'FAIL: {entry}, which every start runs, is not in {SECTION}')
    print('ok')


if __name__ == '__main__':
    main()
