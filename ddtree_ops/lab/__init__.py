"""`ddtree-ops lab`: two local hosts, ct129 and ct200, that behave like the real GPU hosts in
everything but the GPU (real systemd as PID 1, journald, sshd, HTTP; an SGLang stand-in)."""
