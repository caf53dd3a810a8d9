"""Mutual exclusion under real concurrency: a non-atomic read-modify-write of a counter
under the lock comes out exact only if no two clients were ever inside at once."""

import threading
import time

CLIENTS, ROUNDS = 8, 100


def test_eight_clients_times_one_hundred_critical_sections_are_exclusive(server):
    admin = server.client()
    admin.set("counter", 0)
    errors, inside = [], []

    def worker(n):
        r = server.client()
        owner = f"client-{n}"
        try:
            for _ in range(ROUNDS):
                # Spin with the non-waiting form: this test is about exclusion, not waiting.
                deadline = time.monotonic() + 30
                while r.execute_command("RLOCK.ACQUIRE", "lock", owner, 10_000) is not None:
                    assert time.monotonic() < deadline, "could not get the lock in 30 s"
                    time.sleep(0.0005)
                inside.append(owner)
                if len(inside) > 1:
                    errors.append(f"two holders at once: {inside}")
                value = int(r.get("counter"))
                r.set("counter", value + 1)
                inside.remove(owner)
                assert r.execute_command("RLOCK.RELEASE", "lock", owner) == 1
        except Exception as e:  # reported below; a thread must not die silently
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert int(admin.get("counter")) == CLIENTS * ROUNDS
    assert admin.exists("lock") == 0
