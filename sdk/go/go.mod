module github.com/tidemesh/tidemesh/sdk/go

go 1.19
