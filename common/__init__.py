from common.threads import quiet_waits

quiet_waits()  # OMP_WAIT_POLICY=PASSIVE before any script imports torch (common/threads.py)
