#!/usr/bin/env bash
# The story of ddtree-ops, told by the tool itself on the built-in lab hosts (ct129, ct200, and four
# more of the same two GPU classes for the fleet at the end).
# Each step prints the command an operator would type, runs it, and checks the exit code the
# design promises. The lab stays up afterwards for you to try commands.
set -uo pipefail
cd "$(dirname "$0")/.."

bold=$'\e[1m'; dim=$'\e[2m'; off=$'\e[0m'
[ -t 1 ] || { bold=""; dim=""; off=""; }

step() { printf '\n%s== %s%s\n' "$bold" "$1" "$off"; }
run() {  # run EXPECTED_RC command...
    local want=$1; shift
    printf '%s$ %s%s\n' "$bold" "$*" "$off"
    "$@"; local rc=$?
    if [ "$rc" != "$want" ]; then
        printf '\ndemo: expected exit %s from `%s`, got %s\n' "$want" "$*" "$rc" >&2
        exit 1
    fi
    printf '%s(exit %s, as designed)%s\n' "$dim" "$rc" "$off"
}

[ "$(id -u)" = 0 ] || { echo "demo: the lab needs root (network namespaces, systemd-nspawn): run sudo make demo" >&2; exit 1; }

step "Bring up six GPU hosts of two classes as real systemd + sshd machines (an SGLang stand-in serves in place of the GPU server)"
run 0 ddtree-ops lab up --hosts 6
eval "$(ddtree-ops lab env)"
run 0 ddtree-ops lab status

step "ct200 (RTX PRO 6000, sm_120): its profile's mode, DDTree in shadow-linear mode, gated on real readiness"
run 0 ddtree-ops deploy ct200 --dry-run
run 0 ddtree-ops deploy ct200 --yes

step "ct129 (RTX A6000, 48 GB), the story's first attempt: context 131072, mem-fraction 0.88"
run 3 ddtree-ops deploy ct129 --yes \
    --set memory.context_length=131072 --set memory.mem_fraction_static=0.88

step "The second attempt, 32k context x 4 requests at 0.95, on a host whose CUDA driver library is gone"
run 0 ddtree-ops lab fault ct129 libcuda-missing
run 1 ddtree-ops deploy ct129 --yes \
    --set memory.context_length=32768 --set memory.max_running_requests=4 --set memory.mem_fraction_static=0.95
run 0 ddtree-ops lab fault ct129 clear

step "What went wrong on ct129, from its journal (it serves NEXTN again, healthy: exit 0, the failed start named)"
run 0 ddtree-ops diagnose ct129

step "What ct129 ran, and what it runs now"
run 0 ddtree-ops history ct129
run 0 ddtree-ops smoke ct129 ct200

step "ct129's third attempt, with the library back: the shadow deploys and passes its gate"
run 0 ddtree-ops deploy ct129 --yes

step "A minute of greedy traffic on ct129's shadow, then promote: the A6000 class's tree costs more than it brings"
run 0 ddtree-ops lab load ct129 --seconds 70 --wait
run 3 ddtree-ops promote ct129

step "ct200's shadow says the tree pays; a fault breaks the served tree's mask, so the tree misses its prediction live"
run 0 ddtree-ops lab load ct200 --seconds 70 --wait
run 0 ddtree-ops promote ct200 --dry-run
run 0 ddtree-ops lab fault ct200 tree-mask
run 0 ddtree-ops lab load ct200 --seconds 600
run 1 ddtree-ops promote ct200 --yes

step "Back on the shadow (which counts again from its restart), a minute more, and the sound tree is promoted and kept"
run 0 ddtree-ops lab load ct200 --seconds 70 --wait
run 0 ddtree-ops lab load ct200 --seconds 600
run 0 ddtree-ops promote ct200 --yes
run 0 ddtree-ops lab load ct200 --stop
run 0 ddtree-ops history ct200

step "A fleet: group lab (a6000: ct129 ct130 ct131, pro6000: ct200 ct201 ct202), one line each in the lab's inventory"
run 0 ddtree-ops profile show lab

step "DFlash to the whole fleet: a canary with a stay window of its own, then waves of 2, one failure allowed; ct201's CUDA library is gone"
run 0 ddtree-ops lab fault ct201 libcuda-missing
run 1 ddtree-ops deploy lab --mode dflash --canary 1 --canary-stay 15 --batch 2 --max-fail 1 --yes \
    --set gate.stay_healthy_s=5
run 0 ddtree-ops lab fault ct201 clear

step "Across the fleet: which hosts run what, and what went wrong where"
run 0 ddtree-ops history lab
run 0 ddtree-ops diagnose lab
run 0 ddtree-ops rollback lab --yes

cat <<MSG

${bold}What this showed${off}
  - ct200 got DDTree (shadow-linear) only after /health_generate, a real smoke request with
    acceptance > 1 and a stay-healthy window passed.
  - ct129's first attempt never touched the host: preflight predicted the KV pool and refused.
  - the second attempt failed within seconds of its crash line, was rolled back to the NEXTN
    known-good release automatically, and the cause (a CUDA library that will not load) was named.
  - promote read each shadow's verdict from the host's own /metrics: ct129's tree does not pay for
    its verify cost on the A6000 class, so it held (exit 3, nothing changed); ct200's does. With the
    served tree's mask broken, ct200's tree accepted well below the shadow's prediction in the live
    window and was rolled back to the shadow automatically (exit 1); the sound tree then held the
    prediction live and was kept (exit 0).
  - the fleet deploy went canary first; ct201 failed its gate and was rolled back on its own while
    the rest carried on within the budget of one failure; one table said who runs what, and why.

The lab is still up. Try:
  eval "\$(ddtree-ops lab env)"
  ddtree-ops diagnose ct129 --json | head -40
  ddtree-ops deploy ct129 --mode dflash --dry-run
  ddtree-ops promote ct200 --dry-run --json | head -40
  ddtree-ops deploy pro6000 --mode nextn --dry-run   # a group: preflight of every host, the plan
  ddtree-ops lab down            # stops every container and removes namespaces, mounts and links
MSG
