#!/usr/bin/env bash
# How busy the machine is while `make test` runs, every 5 s, at almost no cost of its own (it reads five
# numbers; bench/make_test_cpu.py, which reads every process, took a fifth of the CPU itself, counted as the
# VM's own processes' in runs 25 and 29):
#     bench/make_test_load.sh > FILE.vm.txt &      # before `.ci/run`; kill it after
#     python bench/make_test_timeline.py load FILE.vm.txt[.gz]
# Each line: uptime (s), the machine's busy CPU ticks (user + nice + system + irq + softirq, /proc/stat),
# the ticks of PID 1 (this VM's process_api) and of kdamond (the kernel's memory monitor), and the number of
# processes. Ticks are 1/100 s (getconf CLK_TCK).
set -u
kdamond=$(pgrep -x kdamond.0 | head -n1)
ticks() { [ -n "$1" ] && [ -r "/proc/$1/stat" ] && awk '{print $14 + $15}' "/proc/$1/stat" || echo 0; }
while true; do
    procs=(/proc/[0-9]*)
    echo "$(cut -d' ' -f1 /proc/uptime) $(awk '/^cpu /{print $2 + $3 + $4 + $7 + $8}' /proc/stat)" \
         "$(ticks 1) $(ticks "$kdamond") ${#procs[@]}"
    sleep 5
done
