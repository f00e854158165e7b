/*
 * The create-user protocol as this repository implements it, for SPIN.
 *
 * One student, whose outbox row two senders race to deliver to Users, two
 * Users request handlers, an operator, and the passing of time. Every
 * process may crash at any step and lose its memory; every request and
 * every answer may be lost or delayed, and a request duplicated. docs/model.md
 * maps each step below to the Go function or SQL statement that performs
 * it, and says where and why the model simplifies.
 *
 * Mutations are compile-time switches (spin -DNAME): each removes one
 * piece of the pattern, and model/model_test.go requires SPIN to find a
 * counterexample for each.
 *   NEW_KEY_EACH_ATTEMPT  the sender mints a new idempotency key per attempt
 *   INBOX_OUTSIDE_TX      Users commits the user, then stores the key's answer
 *   MARK_BEFORE_LINK      the row is marked delivered before the user id is recorded
 *   STALE_RECORD          a sender whose lease was taken over still records its failure
 *   NEWOP_UNSAFE          new-operation allowed after a key Users may have acted on
 *   SHORT_RETENTION       Users forgets a key while the sender may still send it
 *   NO_KEY_AGE_CHECK      retry redrive of a key Users may have forgotten
 *   DEDUPE_BY_DOCUMENT    Users answers a taken document number with its holder's user
 *   NO_DOCUMENT_RULE      Users creates a user whatever the document number
 *   NO_LEASE_EXPIRY       a claim never runs out: a crashed sender's row waits for ever
 *   SEND_AFTER_LEASE      a sender sends a row whose lease ran out before the send
 */

/* Two of each: the Clock, purgeable and the properties below name
 * senders and handlers 0 and 1; more would need them extended too. */
#define SENDERS      2
#define HANDLERS     2
#define MAX_ATTEMPTS 2   /* SENDER_MAX_ATTEMPTS */
#define MAX_REDRIVES 1   /* SENDER_MAX_REDRIVES */
#define KEYS         4   /* the row's key, one per new-operation (and per attempt under NEW_KEY_EACH_ATTEMPT) */

/* The faults one run may suffer, of any kinds: a process crashing, a
 * request or an answer lost, a request duplicated, an answer slower than
 * the sender's timeout, a lease running out under a live sender (frozen,
 * or slower than its lease). Finite, so that faults end and liveness can
 * be judged. */
#ifndef FAULTS
#define FAULTS 2
#endif

/* the user of another person who holds the same document number */
#define OTHER 3

/* outbox.state */
#define PENDING   1
#define DELIVERED 2
#define DEAD      3

/* outbox.reason_class of a dead row */
#define NO_CLASS   0
#define REFUSED    1   /* Users said no: new-key safe */
#define EXHAUSTED  2   /* SENDER_MAX_ATTEMPTS used up: Users may have acted */
#define EXPIRED    3   /* SENDER_MAX_AGE passed: Users may have acted */
#define CONFLICT   4   /* the student is linked to another user */

/* the inbox row of a key in Users' database */
#define NO_ROW   0
#define HELD     1   /* claimed by a transaction that has not ended */
#define ANSWERED 2

/* what a sender made of an attempt */
#define GOT_USER    1
#define GOT_REFUSAL 2
#define IN_PROGRESS 3   /* 409 key in progress */
#define NO_ANSWER   4   /* lost, timed out, or Users down */
#define TOO_OLD     5   /* claimed past SENDER_MAX_AGE: dead-lettered unsent */
#define HANDED_BACK 6   /* the lease ran out before the send: Release */

/* ---- Student's database ---- */
bool  committed;        /* Student's transaction: student, row and key */
byte  state;            /* outbox.state */
byte  class;            /* outbox.reason_class */
byte  key;              /* outbox.idempotency_key */
byte  lease;            /* outbox.lease_token: 0 is NULL */
bool  leaseRunning;     /* available_at is still ahead */
byte  attempts;         /* outbox.attempts */
byte  redrives;         /* outbox.redrives */
bool  aged;             /* age_from + SENDER_MAX_AGE has passed */
byte  linked;           /* students.user_id: 0 is NULL, else a user number */

/* ---- Users' database ---- */
byte  inbox[KEYS];      /* NO_ROW, HELD or ANSWERED */
byte  answer[KEYS];     /* the stored answer: a user number, or 0 for a refusal */
byte  users;            /* users created for this student's document number */
bool  otherHolds;       /* another enabled user holds the document number */

/* ---- time ---- */
bool  keyOld;           /* the key is too old to redrive as it is: Users may forget it before a new horizon ends */

/* ---- the network and the fault budgets ---- */
chan  toUsers = [3] of { byte, byte };                /* key, sender */
chan  toSender[SENDERS] = [2] of { byte, byte, byte };  /* key, what, user */
byte  waitKey[SENDERS]; /* 1 + the key each sender waits for an answer on; 0: none (its connection is closed) */
byte  inFlight[KEYS];   /* requests for each key sent and not yet finished by Users */
byte  nextKey = 1;
byte  faults = FAULTS;
/* A crash is decided by the Clock (as a fault) and taken by the process
 * at its next step: a process's own escape (unless) would take priority
 * over every step while the budget lasts. */
bool  senderCrash[SENDERS];
bool  usersCrash[HANDLERS];
bool  handling[HANDLERS];  /* a handler is busy with a request */
bool  leaseLost[SENDERS]; /* the sender's own clock says its lease has run out */
bool  busy[SENDERS];      /* a sender is between its claim and the end of its recording */
byte  holds[SENDERS];   /* the lease each sender works under: 0 when idle or crashed */
byte  holdKey[SENDERS]; /* 1 + the key of that claim */

/* A sender's lease token is its number plus one. One token per sender is
 * enough for the fence: a sender holds one claim at a time, so while the
 * row carries its token, the claim it works on is the row's current one. */

/* Users said the key created nobody, or that the document number was
 * taken: a new key is safe (outbox.NewKeySafe). */
#define newKeySafe (class == REFUSED)

/* the row is settled: delivered with the student linked, or dead */
#define settled ((state == DELIVERED && linked != 0) || state == DEAD)

/* A user exists that the student's row does not account for: the row is
 * delivered or dead-lettered as refused (both say "nothing more to do for
 * this key"), yet a user created under one of the student's keys is not
 * the student's. The other dead classes (exhausted, expired) say Users may
 * have acted, and redriving the same key finds the user. */
#define orphan(u) (users >= u && linked != u && (state == DELIVERED || (state == DEAD && class == REFUSED)))

/* ---------------------------------------------------------------------
 * Student: POST /students writes the student and its create-user row, with
 * a fresh key, in one transaction (store.CreateStudent). Before the commit
 * nothing exists; after it, both do. A crash before the commit is the
 * client's to retry and leaves nothing for the pattern to keep.
 */
active proctype Student() {
	atomic {
		committed = true; state = PENDING; key = 0;
		printf("MSG: Student commits the student and its outbox row with key K0\n")
	}
}

/* ---------------------------------------------------------------------
 * The outbox sender. Each loop is one attempt: claim the row, deliver it,
 * record what came of it. A crash anywhere forgets the claim; its lease
 * runs out and another claim takes the row.
 */
/* ScheduleRetries and MarkDead write only for the holder of the current
 * lease */
#ifdef STALE_RECORD
#define fenced (state == PENDING)
#else
#define fenced (state == PENDING && lease == myLease)
#endif

proctype Sender(byte me) {
	byte myLease = me + 1, myKey, myAttempt, what, user, k;
	bool tooOld, linkLater;

end_idle:
	do
	:: {
		/* ClaimDue: a due row, SKIP LOCKED, a new lease token */
		atomic {
			committed && state == PENDING && !leaseRunning ->
			lease = myLease; leaseRunning = true; attempts++; holds[me] = myLease;
#ifdef NEW_KEY_EACH_ATTEMPT
			if
			:: attempts > 1 && nextKey < KEYS -> key = nextKey; nextKey++
			:: else -> skip
			fi;
#endif
			myKey = key; myAttempt = attempts; tooOld = aged; holdKey[me] = key + 1; busy[me] = true;
			printf("MSG: sender %d claims the row (attempt %d, key K%d, lease %d)\n", me, myAttempt, myKey, myLease)
		};

		/* deliver: a row past its max age is dead-lettered unsent, and a
		 * row whose lease ran out before the send is handed back unsent */
		if
		:: tooOld -> what = TOO_OLD
#ifndef SEND_AFTER_LEASE
		:: atomic { !tooOld && leaseLost[me] -> what = HANDED_BACK;
			printf("MSG: sender %d finds its lease over before sending, and sends nothing\n", me) }
		:: atomic { !tooOld && !leaseLost[me] ->
#else
		:: atomic { !tooOld ->
#endif
				if
				:: inFlight[myKey]++; toUsers!myKey, me; waitKey[me] = myKey + 1;
					printf("MSG: sender %d sends K%d to Users\n", me, myKey)
				:: faults > 0 -> faults--;
					printf("MSG: the network loses sender %d's request\n", me)
				:: faults > 0 -> faults--; inFlight[myKey] = inFlight[myKey] + 2;
					toUsers!myKey, me; toUsers!myKey, me; waitKey[me] = myKey + 1;
					printf("MSG: the network duplicates sender %d's request\n", me)
				fi
			};
			/* wait for the answer to this attempt, or give up (timeout) */
			do
			:: toSender[me]?k, what, user ->
				if
				:: k == myKey -> break
				:: else -> skip   /* an answer for an earlier key */
				fi
			:: atomic { inFlight[myKey] == 0 && empty(toSender[me]) -> what = NO_ANSWER;
				printf("MSG: sender %d times out: no answer is coming\n", me);
				break }
			:: atomic { faults > 0 -> faults--; what = NO_ANSWER;
				printf("MSG: sender %d times out before Users answers\n", me);
				break }
			od
		fi;

		/* record what came of it, in one transaction (store.Record) */
		atomic {
			if
			:: what == GOT_USER ->
				/* LinkStudents: no lease check; a user id answered for the key is the answer */
				if
				:: linked == 0 || linked == user ->
					if
					:: state != DELIVERED -> state = DELIVERED; class = NO_CLASS; lease = 0; leaseRunning = false
					:: else -> skip
					fi;
#ifdef MARK_BEFORE_LINK
					linkLater = true;
					printf("MSG: sender %d marks the row delivered; the link is a second transaction\n", me)
#else
					linked = user;
					printf("MSG: sender %d links the student to user U%d and marks the row delivered\n", me, user)
#endif
				:: else ->
					/* a conflict: LinkStudents dead-letters the row itself, no fence */
					if
					:: state == PENDING -> state = DEAD; class = CONFLICT; lease = 0; leaseRunning = false
					:: else -> skip
					fi;
					printf("MSG: sender %d finds the student linked to another user\n", me)
				fi
			:: what == GOT_REFUSAL || what == TOO_OLD ->
				if
				:: fenced -> state = DEAD; lease = 0; leaseRunning = false;
					if
					:: what == GOT_REFUSAL -> class = REFUSED;
						printf("MSG: sender %d dead-letters the row: refused\n", me)
					:: else -> class = EXPIRED;
						printf("MSG: sender %d dead-letters the row: expired\n", me)
					fi
				:: else ->
					printf("MSG: sender %d records nothing: it no longer holds the lease\n", me)
				fi
			:: what == HANDED_BACK ->
				if
				:: fenced -> lease = 0; leaseRunning = false; attempts--;
					printf("MSG: sender %d hands the row back\n", me)
				:: else -> skip
				fi
			:: what == IN_PROGRESS || what == NO_ANSWER ->
				if
				:: fenced && myAttempt >= MAX_ATTEMPTS ->
					state = DEAD; class = EXHAUSTED; lease = 0; leaseRunning = false;
					printf("MSG: sender %d dead-letters the row: attempts exhausted\n", me)
				:: fenced && myAttempt < MAX_ATTEMPTS ->
					lease = 0; leaseRunning = false;
					printf("MSG: sender %d schedules a retry\n", me)
				:: else ->
					printf("MSG: sender %d records nothing: it no longer holds the lease\n", me)
				fi
			fi;
			holds[me] = 0; holdKey[me] = 0; waitKey[me] = 0; leaseLost[me] = false;
			/* forget the attempt: a closed connection's answers are dropped */
			do
			:: toSender[me]?_, _, _
			:: empty(toSender[me]) -> break
			od;
			k = 0; what = 0; myKey = 0; myAttempt = 0; tooOld = false;
#ifndef MARK_BEFORE_LINK
			user = 0; busy[me] = false
#else
			skip
#endif
		};
#ifdef MARK_BEFORE_LINK
		atomic {
			if
			:: linkLater -> linked = user; linkLater = false;
				printf("MSG: sender %d links the student to user U%d\n", me, user);
				user = 0
			:: else -> skip
			fi;
			busy[me] = false
		};
#endif
		skip
	   } unless {
		atomic { senderCrash[me] -> senderCrash[me] = false; busy[me] = false; holds[me] = 0; holdKey[me] = 0; leaseLost[me] = false; linkLater = false; waitKey[me] = 0;
			do
			:: toSender[me]?_, _, _
			:: empty(toSender[me]) -> break
			od;
			k = 0; what = 0; myKey = 0; myAttempt = 0; tooOld = false; user = 0;
			printf("MSG: sender %d crashes and forgets its claim\n", me) }
	   }
	od
}

/* ---------------------------------------------------------------------
 * Users: POST /users through the inbox (inbox.Do: the key with its
 * answer, then the user, one transaction; a key already stored or a
 * document number taken fails it whole, as a crash does, and the stored
 * answer is replayed or the refusal stored). The key is the
 * transaction's first statement; the user, the business rule and the
 * stored answer are in the same transaction. A request for a key another
 * transaction holds waits for it, or gives up with 409 key-in-progress.
 * A crash rolls the transaction back.
 */
/* An answer reaches a sender still waiting on its key; a sender that gave
 * up has closed the connection, and the answer is dropped. */
inline reply(what, user) {
	if
	:: waitKey[from] == k + 1 && nfull(toSender[from]) -> toSender[from]!k, what, user
	:: waitKey[from] != k + 1 || full(toSender[from]) -> skip
	fi
}

/* The business rule: one enabled user per document number. */
#ifdef NO_DOCUMENT_RULE
#define documentTaken false
#else
#define documentTaken (otherHolds || users > 0)
#endif

proctype Users(byte me) {
	byte k, from, u;
	bool holding;

end_idle:
	do
	:: atomic { toUsers?k, from -> handling[me] = true }; 
	   {
		skip;
claim:
		if
		:: atomic { inbox[k] == NO_ROW -> inbox[k] = HELD; holding = true;
			printf("MSG: Users handler %d claims K%d\n", me, k) }
		:: atomic { inbox[k] == HELD && !holding -> reply(IN_PROGRESS, 0);
			printf("MSG: Users handler %d answers 409: K%d is in progress\n", me, k) };
			goto done
		:: inbox[k] == HELD && !holding -> (inbox[k] != HELD); goto claim   /* waits, then tries again */
		:: atomic { inbox[k] == ANSWERED -> reply((answer[k] == 0 -> GOT_REFUSAL : GOT_USER), answer[k]);
			printf("MSG: Users handler %d replays the stored answer of K%d\n", me, k) };
			goto done
		fi;

#ifdef INBOX_OUTSIDE_TX
		/* the user in its own transaction... */
		atomic {
			if
			:: documentTaken -> u = 0;
				printf("MSG: Users handler %d finds the document number taken, the answer not yet stored\n", me)
			:: else -> users++; u = users;
				printf("MSG: Users handler %d commits user U%d for K%d, the answer not yet stored\n", me, u, k)
			fi
		};
		/* ...and the answer in another */
		atomic {
			inbox[k] = ANSWERED; answer[k] = u; holding = false;
			reply((u == 0 -> GOT_REFUSAL : GOT_USER), u);
			printf("MSG: Users handler %d stores K%d's answer and replies\n", me, k)
		};
#else
		/* the business rule, the user and the answer: one commit */
		atomic {
			if
			:: documentTaken ->
#ifdef DEDUPE_BY_DOCUMENT
				u = (otherHolds -> OTHER : 1);
				printf("MSG: Users handler %d answers K%d with U%d, the holder of the document number\n", me, k, u)
#else
				u = 0;
				printf("MSG: Users handler %d refuses K%d: the document number is taken\n", me, k)
#endif
			:: else -> users++; u = users;
				printf("MSG: Users handler %d creates user U%d for K%d\n", me, u, k)
			fi;
			inbox[k] = ANSWERED; answer[k] = u; holding = false;
			if
			:: reply((u == 0 -> GOT_REFUSAL : GOT_USER), u)
			:: faults > 0 -> faults--;
				printf("MSG: the network loses Users' answer\n")
			fi
		};
#endif
done:
		atomic { inFlight[k]--; k = 0; from = 0; u = 0; handling[me] = false }
	   } unless {
		atomic { usersCrash[me] -> usersCrash[me] = false;
			if
			:: holding -> inbox[k] = NO_ROW; holding = false;
				printf("MSG: Users handler %d crashes; its transaction rolls back\n", me)
			:: else ->
				printf("MSG: Users handler %d crashes after its commit\n", me)
			fi;
			inFlight[k]--; k = 0; from = 0; u = 0; handling[me] = false }
	   }
	od
}

/* ---------------------------------------------------------------------
 * The operator, through the sender's admin API (deadletter, store.Redrive):
 * a dead row is redriven with its key (retry) or, after a refusal only,
 * with a new one (new-operation); and the cause of a refusal may be fixed
 * (the other user holding the document number is disabled).
 */
#ifdef NO_KEY_AGE_CHECK
#define retryAllowed (state == DEAD && redrives < MAX_REDRIVES)
#else
#define retryAllowed (state == DEAD && redrives < MAX_REDRIVES && !keyOld)
#endif
#ifdef NEWOP_UNSAFE
#define newOperationAllowed (state == DEAD && redrives < MAX_REDRIVES && nextKey < KEYS)
#else
#define newOperationAllowed (state == DEAD && redrives < MAX_REDRIVES && nextKey < KEYS && newKeySafe)
#endif

active proctype Operator() {
end_idle:
	do
	:: atomic {
		retryAllowed ->
		state = PENDING; class = NO_CLASS; attempts = 0; aged = false; redrives++;
		lease = 0; leaseRunning = false;
		printf("MSG: the operator redrives the row with its key K%d (retry)\n", key)
	   }
	:: atomic {
		newOperationAllowed ->
		key = nextKey; nextKey++; keyOld = false;
		state = PENDING; class = NO_CLASS; attempts = 0; aged = false; redrives++;
		lease = 0; leaseRunning = false;
		printf("MSG: the operator redrives the row with a new key K%d (new-operation)\n", key)
	   }
	:: atomic { otherHolds -> otherHolds = false;
		printf("MSG: the operator disables the other user holding the document number\n") }
	od
}

/* ---------------------------------------------------------------------
 * Time. A lease runs out (also while its request is in flight); the row
 * passes SENDER_MAX_AGE; a key grows too old to redrive as it is; Users'
 * retention purge deletes a key's answer once no request for it is in
 * flight and the sender can no longer send it.
 */
/* Users may forget a key once its answer is stored, no request for it is
 * in flight, no sender holds a running claim on it (a claim is sent
 * within its lease, long before the retention ends), and the sender can
 * no longer send it: it is an earlier key of the row, or the row's key
 * grown old while the row is not pending. */
#ifdef SHORT_RETENTION
#define purgeable(k) (k < nextKey && inbox[k] == ANSWERED && inFlight[k] == 0)
#else
#define liveClaim(k, i) (holdKey[i] == k + 1 && !leaseLost[i])
#define purgeable(k) (k < nextKey && inbox[k] == ANSWERED && inFlight[k] == 0 && \
                      !liveClaim(k, 0) && !liveClaim(k, 1) && \
                      (k != key || (keyOld && state != PENDING)))
#endif
#define purge(k) inbox[k] = NO_ROW; printf("MSG: Users' retention purge forgets K%d\n", k)

active proctype Clock() {
end_idle:
	do
#ifndef NO_LEASE_EXPIRY
	:: atomic { leaseRunning && holds[0] != lease && holds[1] != lease -> leaseRunning = false;
		printf("MSG: lease %d runs out: its sender crashed\n", lease) }
#endif
	:: atomic { leaseRunning && faults > 0 && (holds[0] == lease || holds[1] == lease) ->
		faults--; leaseRunning = false;
		if
		:: holds[0] == lease -> leaseLost[0] = true
		:: else -> leaseLost[1] = true
		fi;
		printf("MSG: lease %d runs out while its sender still works\n", lease) }
	:: atomic { state == PENDING && !aged -> aged = true;
		printf("MSG: the row passes SENDER_MAX_AGE\n") }
	:: atomic { committed && state != PENDING && !keyOld -> keyOld = true;
		printf("MSG: K%d grows too old to redrive as it is\n", key) }
	:: atomic { faults > 0 && busy[0] && !senderCrash[0] -> faults--; senderCrash[0] = true }
	:: atomic { faults > 0 && busy[1] && !senderCrash[1] -> faults--; senderCrash[1] = true }
	:: atomic { faults > 0 && handling[0] && !usersCrash[0] -> faults--; usersCrash[0] = true }
	:: atomic { faults > 0 && handling[1] && !usersCrash[1] -> faults--; usersCrash[1] = true }
	:: atomic { purgeable(0) -> purge(0) }
	:: atomic { purgeable(1) -> purge(1) }
	:: atomic { purgeable(2) -> purge(2) }
	:: atomic { purgeable(3) -> purge(3) }
	od
}

init {
	byte i;
	if
	:: otherHolds = true   /* the document number starts taken, so Users refuses */
	:: otherHolds = false
	fi;
	atomic {
		i = 0;
		do
		:: i < SENDERS -> run Sender(i); i++
		:: else -> break
		od;
		i = 0;
		do
		:: i < HANDLERS -> run Users(i); i++
		:: else -> break
		od
	}
}

/* ---- properties ---- */

/* at most one user per operation: one per student, over all its keys */
ltl one_user { [] (users <= 1) }
/* a linked student holds the user created under one of its keys */
ltl right_user { [] (linked == 0 || (linked != OTHER && linked <= users)) }
/* no row is settled while a user made for its student is someone else's or nobody's */
ltl no_orphan { [] !(orphan(1) || orphan(2)) }
/* once the faults are spent, every row ends linked or dead and stays so;
 * checked for every run, fair or not */
ltl settles { <> [] settled }
