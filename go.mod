module github.com/renderqueue/renderqueue

go 1.26
