// Runnable examples (go doc, go test): each talks to the server TestMain started.

package rlock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	rlock "github.com/rlock/rlock/clients/go"
)

func ExampleClient_NewMutex() {
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr}) // e.g. "localhost:6379"
	defer rdb.Close()
	client := rlock.New(rdb)
	defer client.Close()

	mutex := client.NewMutex("orders:42")
	if err := mutex.Lock(); err != nil { // waits in the server's queue; the watchdog renews it
		panic(err)
	}
	fmt.Println("locked; held", mutex.Held(), "time(s)")
	if freed, err := mutex.Unlock(); err != nil || !freed {
		panic(err)
	}
	fmt.Println("unlocked")
	// Output:
	// locked; held 1 time(s)
	// unlocked
}

func ExampleMutex_TryLock() {
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr})
	defer rdb.Close()
	client := rlock.New(rdb)
	defer client.Close()

	holder := client.NewMutex("report")
	_ = holder.Lock()
	defer holder.Unlock()

	err := client.NewMutex("report").TryLock()
	fmt.Println(errors.Is(err, rlock.ErrTaken))
	err = client.NewMutex("report", rlock.WithWaitLimit(50*time.Millisecond)).TryLock()
	fmt.Println(errors.Is(err, rlock.ErrTimeout))
	// Output:
	// true
	// true
}

func ExampleMutex_Done() {
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr})
	defer rdb.Close()
	client := rlock.New(rdb, rlock.WithWatchdogTimeout(3*time.Second)) // renewed every second
	defer client.Close()

	mutex := client.NewMutex("job:7")
	_ = mutex.Lock()
	rdb.Del(context.Background(), "job:7") // someone deletes the lock under us

	// A critical section watches Done, as it would a context's.
	select {
	case <-mutex.Done():
		fmt.Println(mutex.Err())
	case <-time.After(time.Minute):
	}
	// Output:
	// rlock: lock lost
}

func ExampleClient_NewFencedMutex() {
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr})
	defer rdb.Close()
	client := rlock.New(rdb)
	defer client.Close()

	ctx := context.Background()
	mutex := client.NewFencedMutex("ledger")
	first, _ := mutex.LockToken(ctx)
	_, _ = mutex.Unlock()
	second, _ := mutex.LockToken(ctx) // pass it to the resource, which refuses older ones
	_, _ = mutex.Unlock()
	fmt.Println(second > first)
	// Output: true
}

func ExampleClient_NewSemaphore() {
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr})
	defer rdb.Close()
	client := rlock.New(rdb)
	defer client.Close()

	ctx := context.Background()
	sem := client.NewSemaphore("workers")
	_, _ = sem.TrySetPermits(ctx, 3)
	_ = sem.Acquire(ctx, 2) // waits in the server's queue when fewer are free
	n, _ := sem.Available(ctx)
	fmt.Println("available:", n)
	_ = sem.Release(ctx, 2)
	// Output: available: 1
}

func ExampleClient_NewCountDownLatch() {
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr})
	defer rdb.Close()
	client := rlock.New(rdb)
	defer client.Close()

	ctx := context.Background()
	latch := client.NewCountDownLatch("batch:7")
	_, _ = latch.TrySetCount(ctx, 2)
	done := make(chan error)
	go func() { done <- latch.Await(ctx) }() // released in the turn the count reaches 0
	_, _ = latch.CountDown(ctx)
	_, _ = latch.CountDown(ctx)
	fmt.Println(<-done)
	// Output: <nil>
}
