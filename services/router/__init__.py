"""The AI traffic router: a live view of every worker and a scheduling framework that ranks
them per request (filter → score → pick). Not on the token path."""
