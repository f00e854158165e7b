// Package deploy checks the deployment against the code: docker-compose.yml,
// the Dockerfile, Prometheus' scrape configuration and Grafana's dashboard
// are held to the binaries' own config loaders and metrics, the shipped
// binaries to the layout that keeps test scaffolding out of them, and the
// configuration page's tables (docs/configuration.md) to the variables each
// binary reads. The compose file and the Dockerfile cannot be run on
// machines without Docker, so the tests read them instead, and a misspelt
// variable or a port nothing listens on fails `make test` rather than a
// deployment. Its few exported names are what the e2e suite shares with
// these checks; no shipped binary imports it.
package deploy
