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
